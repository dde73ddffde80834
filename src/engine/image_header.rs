//! What an image file is before anything decodes it: its format from the magic bytes and its
//! width and height from the header, so an unsupported format or an image over the pixel limit
//! is refused without allocating its pixels (a small file can declare a huge image).

use crate::error::{Error, Result};

/// Formats the projector's decoder (stb_image inside llama.cpp's mtmd) reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Png,
    Jpeg,
    Gif,
    Bmp,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Png => "PNG",
            Format::Jpeg => "JPEG",
            Format::Gif => "GIF",
            Format::Bmp => "BMP",
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
        return Err(Error::ImageFormat(
            "WebP images are not decoded by this build (llama.cpp's mtmd decodes WebP only by running ffmpeg); convert it to PNG or JPEG first".into(),
        ));
    }
    Err(Error::ImageFormat(
        "the bytes are not a PNG, JPEG, GIF or BMP image (unknown magic bytes); send one of those formats".into(),
    ))
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
    fn refuses_unknown_webp_truncated_and_oversized() {
        let l = ImageLimits {
            max_bytes: 100,
            max_pixels: 1000,
        };
        let code = |b: &[u8]| check(b, &l).unwrap_err().code();
        assert_eq!(code(b"hello world"), "ERR_IMAGE_FORMAT");
        assert_eq!(code(b"RIFF\0\0\0\0WEBPVP8 "), "ERR_IMAGE_FORMAT");
        assert_eq!(code(&png(10, 10)[..20]), "ERR_IMAGE_DECODE");
        assert_eq!(code(&[0xff, 0xd8, 0xff, 0xe0]), "ERR_IMAGE_DECODE");
        assert_eq!(code(&png(0, 10)), "ERR_IMAGE_DECODE");
        assert_eq!(code(&png(100, 11)), "ERR_IMAGE_TOO_LARGE");
        assert_eq!(code(&[0u8; 101]), "ERR_IMAGE_TOO_LARGE");
        assert!(check(&png(100, 10), &l).is_ok());
    }
}
