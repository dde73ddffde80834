//! What an image file is before anything decodes it: its format from the magic bytes and its
//! width and height from the header, so an unsupported format or an image over the pixel limit
//! is refused without allocating its pixels (a small file can declare a huge image). WebP, which
//! llama.cpp's mtmd reads only by running ffmpeg, is decoded here in Rust (`decode_webp`).

use crate::error::{Error, Result};

/// Formats images are taken in: those the projector's decoder (stb_image inside llama.cpp's
/// mtmd) reads, and WebP (`decode_webp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Png,
    Jpeg,
    Gif,
    Bmp,
    Webp,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Png => "PNG",
            Format::Jpeg => "JPEG",
            Format::Gif => "GIF",
            Format::Bmp => "BMP",
            Format::Webp => "WebP",
        }
    }
}

/// Size limits of the images a context takes (`imageMaxBytes`, `imageMaxPixels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    pub max_bytes: u64,
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        ImageLimits {
            max_bytes: 20 << 20,
            max_pixels: 4096 * 4096,
        }
    }
}

/// The image's format, width and height, checked against `limits`.
pub fn check(bytes: &[u8], limits: &ImageLimits) -> Result<(Format, u32, u32)> {
    if bytes.len() as u64 > limits.max_bytes {
        return Err(Error::ImageTooLarge(format!(
            "the image file is {} bytes, over the limit of {} (option imageMaxBytes); send a smaller file",
            bytes.len(),
            limits.max_bytes
        )));
    }
    let (format, w, h) = header(bytes)?;
    if w == 0 || h == 0 {
        return Err(Error::ImageDecode(format!(
            "the {} header declares a {w}×{h} image; send a complete image file",
            format.name()
        )));
    }
    if w as u64 * h as u64 > limits.max_pixels {
        return Err(Error::ImageTooLarge(format!(
            "the image is {w}×{h} = {} pixels, over the limit of {} (option imageMaxPixels); scale it down first",
            w as u64 * h as u64,
            limits.max_pixels
        )));
    }
    Ok((format, w, h))
}

fn truncated(format: Format) -> Error {
    Error::ImageDecode(format!(
        "the {} file is truncated before its size is given; send the whole file",
        format.name()
    ))
}

fn header(b: &[u8]) -> Result<(Format, u32, u32)> {
    let be32 = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let le16 = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as u32;
    if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        // The IHDR chunk comes first: length, "IHDR", width, height (big-endian).
        if b.len() < 24 || &b[12..16] != b"IHDR" {
            return Err(truncated(Format::Png));
        }
        return Ok((Format::Png, be32(16), be32(20)));
    }
    if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        if b.len() < 10 {
            return Err(truncated(Format::Gif));
        }
        return Ok((Format::Gif, le16(6), le16(8)));
    }
    if b.starts_with(b"BM") && b.len() >= 2 {
        if b.len() < 26 {
            return Err(truncated(Format::Bmp));
        }
        let w = i32::from_le_bytes([b[18], b[19], b[20], b[21]]);
        let h = i32::from_le_bytes([b[22], b[23], b[24], b[25]]);
        return Ok((Format::Bmp, w.unsigned_abs(), h.unsigned_abs()));
    }
    if b.starts_with(&[0xff, 0xd8, 0xff]) {
        return jpeg_size(b).map(|(w, h)| (Format::Jpeg, w, h));
    }
    if b.len() >= 12 && &b[0..4] == b"RIFF" && &b[8..12] == b"WEBP" {
        return webp_size(b).map(|(w, h)| (Format::Webp, w, h));
    }
    Err(Error::ImageFormat(
        "the bytes are not a PNG, JPEG, GIF, BMP or WebP image (unknown magic bytes); send one of those formats".into(),
    ))
}

/// Width and height from a WebP's first chunk: a lossy frame (`VP8 `), a lossless one (`VP8L`)
/// or the extended format's canvas (`VP8X`).
fn webp_size(b: &[u8]) -> Result<(u32, u32)> {
    let le24 = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], 0]);
    let need = |n: usize| {
        if b.len() < n {
            Err(truncated(Format::Webp))
        } else {
            Ok(())
        }
    };
    need(16)?;
    match &b[12..16] {
        b"VP8 " => {
            // Frame tag (3 bytes), start code 9d 01 2a, then 14-bit width and height.
            need(30)?;
            if b[23..26] != [0x9d, 0x01, 0x2a] {
                return Err(Error::ImageDecode(
                    "the WebP file's lossy frame has no start code; send a complete WebP file"
                        .into(),
                ));
            }
            let w = u16::from_le_bytes([b[26], b[27]]) & 0x3fff;
            let h = u16::from_le_bytes([b[28], b[29]]) & 0x3fff;
            Ok((w.into(), h.into()))
        }
        b"VP8L" => {
            // Signature 0x2f, then width - 1 and height - 1 in 14 bits each.
            need(25)?;
            if b[20] != 0x2f {
                return Err(Error::ImageDecode(
                    "the WebP file's lossless frame has no signature; send a complete WebP file"
                        .into(),
                ));
            }
            let bits = u32::from_le_bytes([b[21], b[22], b[23], b[24]]);
            Ok(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
        }
        b"VP8X" => {
            // Flags and reserved bytes, then canvas width - 1 and height - 1 in 24 bits each.
            need(30)?;
            Ok((le24(24) + 1, le24(27) + 1))
        }
        _ => Err(Error::ImageDecode(
            "the WebP file starts with no image chunk (VP8, VP8L or VP8X); send a complete WebP file"
                .into(),
        )),
    }
}

/// An image's id: the SHA-256 of its file's bytes in hex, as mtmd's helper names the images it
/// decodes (the prefix cache and the events key images by it).
pub fn file_id(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A WebP file's pixels as RGB rows (an alpha channel is dropped, as stb_image drops it for the
/// other formats; an animation gives its first frame): `(width, height, pixels)`. The caller
/// has checked the header against the size limits.
pub fn decode_webp(bytes: &[u8]) -> Result<(u32, u32, Vec<u8>)> {
    let failed = |e: image_webp::DecodingError| {
        Error::ImageDecode(format!(
            "the WebP image could not be decoded ({e}); send a complete WebP, PNG or JPEG file"
        ))
    };
    let mut decoder = image_webp::WebPDecoder::new(std::io::Cursor::new(bytes)).map_err(failed)?;
    let (w, h) = decoder.dimensions();
    let size = decoder
        .output_buffer_size()
        .ok_or_else(|| Error::ImageTooLarge(format!("the WebP image is {w}×{h}; scale it down")))?;
    let mut pixels = vec![0u8; size];
    decoder.read_image(&mut pixels).map_err(failed)?;
    if decoder.has_alpha() {
        pixels = pixels
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect();
    }
    Ok((w, h, pixels))
}

/// Width and height from a JPEG's first start-of-frame segment.
fn jpeg_size(b: &[u8]) -> Result<(u32, u32)> {
    let mut i = 2;
    loop {
        // Markers may be padded with 0xff bytes.
        while i < b.len() && b[i] == 0xff {
            i += 1;
        }
        if i >= b.len() {
            return Err(truncated(Format::Jpeg));
        }
        let marker = b[i];
        i += 1;
        // Standalone markers carry no length.
        if marker == 0x01 || (0xd0..=0xd7).contains(&marker) {
            continue;
        }
        if marker == 0xd9 || marker == 0xda {
            // End of image, or scan data before any frame header.
            return Err(Error::ImageDecode(
                "the JPEG file has no frame header before its image data; send a complete JPEG"
                    .into(),
            ));
        }
        if i + 2 > b.len() {
            return Err(truncated(Format::Jpeg));
        }
        let len = u16::from_be_bytes([b[i], b[i + 1]]) as usize;
        let is_sof = (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker);
        if is_sof {
            if i + 7 > b.len() {
                return Err(truncated(Format::Jpeg));
            }
            let h = u16::from_be_bytes([b[i + 3], b[i + 4]]) as u32;
            let w = u16::from_be_bytes([b[i + 5], b[i + 6]]) as u32;
            return Ok((w, h));
        }
        if len < 2 {
            return Err(Error::ImageDecode(
                "the JPEG file has a malformed segment; send a complete JPEG".into(),
            ));
        }
        i += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend_from_slice(&w.to_be_bytes());
        b.extend_from_slice(&h.to_be_bytes());
        b.extend_from_slice(&[8, 2, 0, 0, 0]);
        b
    }

    #[test]
    fn reads_png_gif_bmp_and_jpeg_sizes() {
        let l = ImageLimits::default();
        assert_eq!(check(&png(640, 480), &l).unwrap(), (Format::Png, 640, 480));
        let gif = [b"GIF89a".as_slice(), &[0x20, 0x01, 0x10, 0x00]].concat();
        assert_eq!(check(&gif, &l).unwrap(), (Format::Gif, 288, 16));
        let mut bmp = vec![0u8; 26];
        bmp[..2].copy_from_slice(b"BM");
        bmp[18..22].copy_from_slice(&7i32.to_le_bytes());
        bmp[22..26].copy_from_slice(&(-9i32).to_le_bytes());
        assert_eq!(check(&bmp, &l).unwrap(), (Format::Bmp, 7, 9));
        // SOI, an APP0 segment of 4 bytes, then SOF0 (length 17): height 300, width 200.
        let jpeg = [
            0xff, 0xd8, 0xff, 0xe0, 0x00, 0x04, 0x00, 0x00, 0xff, 0xc0, 0x00, 0x11, 0x08, 0x01,
            0x2c, 0x00, 0xc8,
        ];
        assert_eq!(check(&jpeg, &l).unwrap(), (Format::Jpeg, 200, 300));
    }

    #[test]
    fn refuses_unknown_truncated_and_oversized() {
        let l = ImageLimits {
            max_bytes: 100,
            max_pixels: 1000,
        };
        let code = |b: &[u8]| check(b, &l).unwrap_err().code();
        assert_eq!(code(b"hello world"), "ERR_IMAGE_FORMAT");
        assert_eq!(code(b"RIFF\0\0\0\0WEBPVP8 "), "ERR_IMAGE_DECODE");
        assert_eq!(code(b"RIFF\0\0\0\0WEBPABCD"), "ERR_IMAGE_DECODE");
        assert_eq!(code(&png(10, 10)[..20]), "ERR_IMAGE_DECODE");
        assert_eq!(code(&[0xff, 0xd8, 0xff, 0xe0]), "ERR_IMAGE_DECODE");
        assert_eq!(code(&png(0, 10)), "ERR_IMAGE_DECODE");
        assert_eq!(code(&png(100, 11)), "ERR_IMAGE_TOO_LARGE");
        assert_eq!(code(&[0u8; 101]), "ERR_IMAGE_TOO_LARGE");
        assert!(check(&png(100, 10), &l).is_ok());
    }

    const LOSSLESS: &[u8] = include_bytes!("../../test/fixtures/seed77-40x32-lossless.webp");
    const LOSSY: &[u8] = include_bytes!("../../test/fixtures/seed77-40x32-lossy.webp");
    const LOSSY_ALPHA: &[u8] = include_bytes!("../../test/fixtures/seed77-40x32-lossy-alpha.webp");

    #[test]
    fn reads_and_decodes_webp_lossless_lossy_and_extended() {
        let l = ImageLimits::default();
        for file in [LOSSLESS, LOSSY, LOSSY_ALPHA] {
            assert_eq!(check(file, &l).unwrap(), (Format::Webp, 40, 32));
            let (w, h, pixels) = decode_webp(file).unwrap();
            assert_eq!((w, h, pixels.len()), (40, 32, 40 * 32 * 3));
        }
        // Lossless and lossy files of one picture: lossless is exact, lossy only close.
        let exact = decode_webp(LOSSLESS).unwrap().2;
        let close = decode_webp(LOSSY).unwrap().2;
        let off = exact
            .iter()
            .zip(&close)
            .map(|(a, b)| a.abs_diff(*b) as u64)
            .sum::<u64>();
        assert!(
            off > 0 && off < 40 * 32 * 3 * 24,
            "mean error {}",
            off / (40 * 32 * 3)
        );
    }

    #[test]
    fn refuses_truncated_and_oversized_webp() {
        let small = ImageLimits {
            max_bytes: 1 << 20,
            max_pixels: 40 * 32 - 1,
        };
        assert_eq!(
            check(LOSSY, &small).unwrap_err().code(),
            "ERR_IMAGE_TOO_LARGE"
        );
        let l = ImageLimits::default();
        assert_eq!(
            check(&LOSSY[..28], &l).unwrap_err().code(),
            "ERR_IMAGE_DECODE"
        );
        let cut = &LOSSY[..LOSSY.len() / 2];
        assert_eq!(check(cut, &l).unwrap(), (Format::Webp, 40, 32));
        assert_eq!(decode_webp(cut).unwrap_err().code(), "ERR_IMAGE_DECODE");
        let mut spoiled = LOSSLESS.to_vec();
        for b in &mut spoiled[30..] {
            *b ^= 0x5a;
        }
        assert_eq!(
            decode_webp(&spoiled).unwrap_err().code(),
            "ERR_IMAGE_DECODE"
        );
    }
}
