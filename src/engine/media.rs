//! Images in a branch's sequence. A prompt of text runs and images (tokenized by the projector,
//! llama/mtmd.rs) is prefilled into one branch by `BranchStore::prefill_media`: text runs through
//! the one decode engine, each image as one decode of its embedding rows (encoded first, by the
//! caller's `ImageSource`). All or nothing: on any failure the cells written are removed and the
//! branch is unchanged.
//!
//! How a branch remembers an image: an image of `n_pos` positions takes the cells
//! `[start, start + n_pos)` of the branch's sequence, and the branch keeps an `ImageSpan` with
//! that range and the image's id (the SHA-256 of its file bytes). A token list of the branch has
//! no token ids for those positions: saved states keep the spans beside the cells instead (one
//! section layout, `write_spans`/`read_spans`: tree files, prefix-cache files with
//! `IMAGE_POSITION` in their token lists) and give them back on restore; the Scheduler keys an
//! image by its id (lib/scheduler/image-keys.js). A fork keeps the spans below its fork point and
//! cannot start inside an image.

use std::sync::Arc;

use super::decode::{decode_runs, Output, Run};
use super::handles::Handle;
use super::kv::KvBackend;
use super::saved_state::{Reader, Writer};
use super::store::BranchStore;
use crate::error::{Error, Result};
use crate::llama::{Pos, Token};

/// What a saved token list holds at an image's positions: never a token id.
pub const IMAGE_POSITION: Token = -1;

/// An image's positions in a branch's sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpan {
    pub start: Pos,
    pub n_pos: Pos,
    /// The SHA-256 (hex) of the image file's bytes.
    pub id: Arc<str>,
}

/// One piece of a prompt to prefill.
#[derive(Debug, Clone, Copy)]
pub enum MediaPiece<'a> {
    Text(&'a [Token]),
    /// An image of `n_tokens` embedding rows taking `n_pos` positions.
    Image {
        n_tokens: usize,
        n_pos: Pos,
        id: &'a str,
    },
}

impl MediaPiece<'_> {
    fn positions(&self) -> i64 {
        match self {
            MediaPiece::Text(t) => t.len() as i64,
            MediaPiece::Image { n_pos, .. } => *n_pos as i64,
        }
    }
}

/// Where image pieces' embeddings come from (the projector, behind the napi layer).
pub trait ImageSource {
    /// Width of each embedding row.
    fn n_embd(&self) -> usize;
    /// Runs the encoder on piece `i` (an image): `n_tokens × n_embd` floats.
    fn encode(&mut self, i: usize) -> Result<Vec<f32>>;
    /// Whether piece `i` is decoded with non-causal attention.
    fn non_causal(&self, i: usize) -> bool;
}

/// The spans wholly below `position` (what a fork at `position` keeps).
pub fn images_below(images: &[ImageSpan], position: Pos) -> Vec<ImageSpan> {
    images
        .iter()
        .filter(|s| s.start + s.n_pos <= position)
        .cloned()
        .collect()
}

/// `ERR_IMAGE_POSITIONS` when `position` falls strictly inside an image.
pub fn check_not_inside(images: &[ImageSpan], position: Pos) -> Result<()> {
    match images
        .iter()
        .find(|s| s.start < position && position < s.start + s.n_pos)
    {
        Some(s) => Err(Error::ImagePositions(format!(
            "position {position} is inside an image at positions [{}, {}); fork at {} (before it) or {} (after it)",
            s.start,
            s.start + s.n_pos,
            s.start,
            s.start + s.n_pos
        ))),
        None => Ok(()),
    }
}

/// Why `spans` cannot be a branch's images over its first `len` positions (None: they can):
/// ordered, apart, inside `[0, len)`, each id a SHA-256 in lowercase hex. For spans read from
/// a file or given by JS, before a branch takes them.
pub fn spans_problem(spans: &[ImageSpan], len: Pos) -> Option<String> {
    let mut end = 0;
    for s in spans {
        if s.n_pos <= 0 || s.start < end || s.start.checked_add(s.n_pos).is_none_or(|e| e > len) {
            return Some(format!(
                "an image at positions [{}, {}) is not ordered, apart and inside the {len} positions",
                s.start,
                s.start.saturating_add(s.n_pos)
            ));
        }
        let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
        if s.id.len() != 64 || !s.id.chars().all(hex) {
            return Some(format!(
                "an image id {:?} is not a SHA-256 in lowercase hex",
                s.id
            ));
        }
        end = s.start + s.n_pos;
    }
    None
}

/// Writes `spans` as a saved-state section: a count, then each start, positions and id.
pub fn write_spans(w: &mut Writer, spans: &[ImageSpan]) {
    w.u32(spans.len() as u32);
    for s in spans {
        w.u32(s.start as u32);
        w.u32(s.n_pos as u32);
        w.str(&s.id);
    }
}

/// Reads what `write_spans` wrote, checked (`spans_problem`) for a branch of `len` positions.
pub fn read_spans(r: &mut Reader, len: Pos) -> Result<Vec<ImageSpan>> {
    let n = r.count(12)?;
    let mut spans = Vec::with_capacity(n);
    for _ in 0..n {
        let (start, n_pos) = (r.u32()?, r.u32()?);
        let id = r.str()?;
        if start > i32::MAX as u32 || n_pos > i32::MAX as u32 {
            return Err(r.bad(format!("an image at position {start} of {n_pos} positions")));
        }
        spans.push(ImageSpan {
            start: start as Pos,
            n_pos: n_pos as Pos,
            id: Arc::from(id),
        });
    }
    match spans_problem(&spans, len) {
        Some(why) => Err(r.bad(why)),
        None => Ok(spans),
    }
}

/// The pieces of `pieces` within the positions `range` (None: all), each with its index (an
/// image's chunk in the tokenized prompt): text runs cut to the range, images whole.
/// `ERR_IMAGE_POSITIONS` when the range cuts an image; ERR_INVALID_ARG when it is not inside the
/// prompt.
fn pieces_in<'a>(
    pieces: &[MediaPiece<'a>],
    range: Option<(i64, i64)>,
) -> Result<Vec<(usize, MediaPiece<'a>)>> {
    let total: i64 = pieces.iter().map(MediaPiece::positions).sum();
    let (from, to) = range.unwrap_or((0, total));
    if !(0 <= from && from <= to && to <= total) {
        return Err(Error::invalid(format!(
            "prefill: the range [{from}, {to}) is not inside the prompt's {total} positions"
        )));
    }
    let mut out = Vec::new();
    let mut at = 0;
    for (i, &piece) in pieces.iter().enumerate() {
        let (lo, hi) = (at.max(from), (at + piece.positions()).min(to));
        match piece {
            _ if lo >= hi => {}
            MediaPiece::Text(t) => out.push((i, MediaPiece::Text(&t[(lo - at) as usize..(hi - at) as usize]))),
            MediaPiece::Image { .. } if lo == at && hi == at + piece.positions() => out.push((i, piece)),
            MediaPiece::Image { .. } => {
                return Err(Error::ImagePositions(format!(
                    "prefill: the range [{from}, {to}) cuts the image at the prompt's positions [{at}, {}); start and end it at an image's edge",
                    at + piece.positions()
                )))
            }
        }
        at += piece.positions();
    }
    Ok(out)
}

impl BranchStore {
    /// Branch `h`, restored from a state whose cells hold `spans` (checked by the caller), knows
    /// its images again.
    pub fn take_images(&mut self, h: Handle, spans: Vec<ImageSpan>) -> Result<()> {
        self.get_mut(h)?.images = spans;
        Ok(())
    }

    /// Prefills `pieces` into branch `h` (see the module docs). Checked before anything is
    /// written: the positions fit nCtx, each image fits one decode (non-causal image tokens must
    /// share one ubatch, or llama.cpp aborts) and takes one position per token (no M-RoPE).
    /// `range`: the prompt's positions to prefill (None: all), so a prompt whose start came from
    /// elsewhere (a cached prefix) goes on where it was cut; it may not cut an image.
    pub fn prefill_media<K: KvBackend>(
        &mut self,
        kv: &mut K,
        h: Handle,
        pieces: &[MediaPiece],
        range: Option<(i64, i64)>,
        images: &mut dyn ImageSource,
        cancel: &dyn Fn() -> bool,
    ) -> Result<()> {
        let b = self.get(h)?;
        b.check_has_prefix()?;
        let (seq, start) = (b.seq, b.position);
        let pieces = pieces_in(pieces, range)?;
        let total: i64 = pieces.iter().map(|(_, p)| p.positions()).sum();
        let n_ctx = kv.n_ctx() as i64;
        if start as i64 + total > n_ctx {
            return Err(Error::ImagePositions(format!(
                "the prompt takes {total} positions (each image as many as it has tokens) from position {start}, past nCtx = {n_ctx}; create the context with a larger nCtx or send fewer images"
            )));
        }
        let n_batch = kv.n_batch() as usize;
        for (_, piece) in &pieces {
            if let MediaPiece::Image {
                n_tokens, n_pos, ..
            } = *piece
            {
                if n_pos as usize != n_tokens {
                    return Err(Error::ImageUnsupported(format!(
                        "an image of {n_tokens} tokens takes {n_pos} positions (M-RoPE), which llama-branch does not support yet"
                    )));
                }
                if n_tokens > n_batch {
                    return Err(Error::ImagePositions(format!(
                        "an image takes {n_tokens} positions, which must be decoded together in one batch, and this context's nBatch is {n_batch}; create the context with nBatch >= {n_tokens}"
                    )));
                }
            }
        }
        let limits = self.limits(kv);
        let mut spans = Vec::new();
        let mut position = start;
        let mut wrote_logits = false;
        let result = (|| {
            for &(i, piece) in &pieces {
                if cancel() {
                    return Err(Error::Aborted);
                }
                match piece {
                    MediaPiece::Text([]) => {}
                    MediaPiece::Text(tokens) => {
                        let run = Run {
                            seq,
                            start: position,
                            tokens,
                            output: Output::Last,
                        };
                        let branches = &mut self.branches;
                        decode_runs(
                            kv,
                            &mut self.batch,
                            &[run],
                            limits,
                            cancel,
                            &mut |kv, outs| {
                                for o in outs {
                                    let row = kv.logits_row(o.row)?;
                                    branches
                                        .get_mut(h)
                                        .ok_or(Error::BranchDisposed)?
                                        .set_pending(row);
                                }
                                Ok(())
                            },
                        )?;
                        position += tokens.len() as Pos;
                    }
                    MediaPiece::Image {
                        n_tokens,
                        n_pos,
                        id,
                    } => {
                        let embd = images.encode(i)?;
                        let width = images.n_embd();
                        if width == 0 || embd.len() != n_tokens * width {
                            return Err(Error::Internal(format!(
                                "the encoder returned {} floats for {n_tokens} tokens of width {width}",
                                embd.len()
                            )));
                        }
                        if cancel() {
                            return Err(Error::Aborted);
                        }
                        let batch = &mut self.batch;
                        batch.clear();
                        for (k, row) in embd.chunks_exact(width).enumerate() {
                            batch.push_embd(row, position + k as Pos, seq, k + 1 == n_tokens);
                        }
                        let decoded = kv.decode_embd(batch, images.non_causal(i));
                        batch.clear();
                        decoded?;
                        let row = kv.logits_row(-1)?;
                        self.branches
                            .get_mut(h)
                            .ok_or(Error::BranchDisposed)?
                            .set_pending(row);
                        spans.push(ImageSpan {
                            start: position,
                            n_pos,
                            id: Arc::from(id),
                        });
                        position += n_pos;
                    }
                }
                wrote_logits = true;
            }
            Ok(())
        })();
        if let Err(e) = result {
            kv.seq_rm(seq, start, -1);
            return Err(e);
        }
        if !wrote_logits {
            return Ok(());
        }
        let b = self.branches.get_mut(h).ok_or(Error::BranchDisposed)?;
        b.commit_pending();
        b.position = position;
        b.images.extend(spans);
        let n = (position - start) as u32;
        self.segments.append(&mut b.runs, n);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::FakeKv;
    use crate::engine::store::ForkOptions;
    use crate::engine::store_tests::root;

    /// Embeddings of width 4; fails on the pieces listed in `fail`.
    struct Fake {
        encodes: usize,
        fail: Vec<usize>,
    }

    impl Fake {
        fn new(fail: &[usize]) -> Fake {
            Fake {
                encodes: 0,
                fail: fail.to_vec(),
            }
        }
    }

    impl ImageSource for Fake {
        fn n_embd(&self) -> usize {
            4
        }
        fn encode(&mut self, i: usize) -> Result<Vec<f32>> {
            if self.fail.contains(&i) {
                return Err(Error::ImageDecode("broken".into()));
            }
            self.encodes += 1;
            Ok(vec![0.5; 3 * 4])
        }
        fn non_causal(&self, _: usize) -> bool {
            true
        }
    }

    const IMAGE: MediaPiece = MediaPiece::Image {
        n_tokens: 3,
        n_pos: 3,
        id: "x",
    };

    #[test]
    fn a_prompt_with_images_advances_by_its_positions_and_forks_share_them() {
        let mut kv = FakeKv::new(64, 4);
        let mut store = BranchStore::new(4, false);
        let h = root(&mut kv, &mut store, &[1, 2]);
        let mut src = Fake::new(&[]);
        let pieces = [MediaPiece::Text(&[3]), IMAGE, MediaPiece::Text(&[4, 5])];
        store
            .prefill_media(&mut kv, h, &pieces, None, &mut src, &|| false)
            .unwrap();
        let b = store.get(h).unwrap();
        assert_eq!(b.position, 2 + 1 + 3 + 2);
        assert_eq!(kv.seq_pos_max(b.seq), 7);
        assert_eq!(b.images, vec![span(3, 3)]);
        assert_eq!(src.encodes, 1);
        assert_eq!(store.kv_pressure(&kv).cells_used, 8);
        let child = store.fork(&kv, h, ForkOptions::default()).unwrap();
        assert_eq!(store.get(child).unwrap().images, vec![span(3, 3)]);
        assert_eq!(store.kv_pressure(&kv).cells_used, 8, "shared, not copied");
        let at = |p| ForkOptions {
            position: Some(p),
            ..ForkOptions::default()
        };
        assert_eq!(
            store.fork(&kv, h, at(4)).unwrap_err().code(),
            "ERR_IMAGE_POSITIONS"
        );
        let before = store.fork(&kv, h, at(3)).unwrap();
        assert_eq!(store.get(before).unwrap().images, vec![]);
        assert_eq!(src.encodes, 1);
    }

    #[test]
    fn a_prompt_prefilled_in_ranges_equals_it_whole_and_a_range_never_cuts_an_image() {
        let pieces = [MediaPiece::Text(&[3, 4]), IMAGE, MediaPiece::Text(&[5, 6])];
        let whole = {
            let mut kv = FakeKv::new(64, 4);
            let mut store = BranchStore::new(4, false);
            let h = root(&mut kv, &mut store, &[1]);
            let mut src = Fake::new(&[]);
            store
                .prefill_media(&mut kv, h, &pieces, None, &mut src, &|| false)
                .unwrap();
            (kv.snapshot(), store.get(h).unwrap().images.clone())
        };
        let mut kv = FakeKv::new(64, 4);
        let mut store = BranchStore::new(4, false);
        let h = root(&mut kv, &mut store, &[1]);
        let mut src = Fake::new(&[]);
        let mut run = |store: &mut BranchStore, kv: &mut FakeKv, range| {
            store.prefill_media(kv, h, &pieces, Some(range), &mut src, &|| false)
        };
        for cut in [(1, 3), (3, 4), (2, 4)] {
            let e = run(&mut store, &mut kv, cut).unwrap_err();
            assert_eq!(e.code(), "ERR_IMAGE_POSITIONS", "{cut:?}");
        }
        assert_eq!(
            run(&mut store, &mut kv, (0, 8)).unwrap_err().code(),
            "ERR_INVALID_ARG"
        );
        assert_eq!(
            run(&mut store, &mut kv, (2, 1)).unwrap_err().code(),
            "ERR_INVALID_ARG"
        );
        run(&mut store, &mut kv, (0, 1)).unwrap();
        run(&mut store, &mut kv, (1, 5)).unwrap();
        run(&mut store, &mut kv, (5, 7)).unwrap();
        assert_eq!(src.encodes, 1);
        let b = store.get(h).unwrap();
        assert_eq!(b.position, 1 + 7);
        assert_eq!((kv.snapshot(), b.images.clone()), whole);
    }

    #[test]
    fn spans_round_trip_through_a_section_and_bad_ones_are_corruption() {
        use crate::engine::saved_state::Payload;
        let id = |c: char| Arc::from(c.to_string().repeat(64).as_str());
        let spans = vec![
            ImageSpan {
                start: 1,
                n_pos: 3,
                id: id('a'),
            },
            ImageSpan {
                start: 4,
                n_pos: 2,
                id: id('0'),
            },
        ];
        let mut w = Writer::default();
        write_spans(&mut w, &spans);
        let read = |bytes: &[u8], len| {
            read_spans(&mut Reader::new(bytes, "f", Payload::Prefix, "images"), len)
        };
        assert_eq!(read(&w.0, 6).unwrap(), spans);
        assert_eq!(
            read(&w.0, 5).unwrap_err().code(),
            "ERR_STATE_CORRUPT",
            "past the end"
        );
        for bad in [
            vec![
                ImageSpan {
                    start: 2,
                    ..spans[1].clone()
                },
                spans[0].clone(),
            ],
            vec![ImageSpan {
                start: 0,
                n_pos: 0,
                id: id('a'),
            }],
            vec![ImageSpan {
                start: 0,
                n_pos: 1,
                id: id('A'),
            }],
            vec![ImageSpan {
                start: 0,
                n_pos: 1,
                id: Arc::from("abc"),
            }],
        ] {
            let mut w = Writer::default();
            write_spans(&mut w, &bad);
            assert_eq!(
                read(&w.0, 8).unwrap_err().code(),
                "ERR_STATE_CORRUPT",
                "{bad:?}"
            );
        }
        for cut in 0..w.0.len() {
            assert!(read(&w.0[..cut], 6).is_err(), "truncated at {cut}");
        }
    }

    #[test]
    fn a_failed_or_refused_media_prefill_changes_nothing() {
        let mut kv = FakeKv::new(16, 2);
        let mut store = BranchStore::new(2, false);
        let h = root(&mut kv, &mut store, &[1, 2]);
        let cells = kv.snapshot();
        let mut src = Fake::new(&[2]);
        let pieces = [MediaPiece::Text(&[3]), IMAGE, IMAGE];
        let err = store
            .prefill_media(&mut kv, h, &pieces, None, &mut src, &|| false)
            .unwrap_err();
        assert_eq!(err.code(), "ERR_IMAGE_DECODE");
        assert_eq!(
            kv.snapshot(),
            cells,
            "the text and first image are removed again"
        );
        let b = store.get(h).unwrap();
        assert_eq!((b.position, b.images.len()), (2, 0));
        // Past nCtx, or an image larger than one decode: refused before anything runs.
        let long = [IMAGE; 5];
        let code = |store: &mut BranchStore, kv: &mut FakeKv, p: &[MediaPiece]| {
            let mut src = Fake::new(&[]);
            let e = store
                .prefill_media(kv, h, p, None, &mut src, &|| false)
                .unwrap_err();
            assert_eq!(src.encodes, 0);
            e.code()
        };
        assert_eq!(code(&mut store, &mut kv, &long), "ERR_IMAGE_POSITIONS");
        kv.n_batch = 2;
        assert_eq!(code(&mut store, &mut kv, &[IMAGE]), "ERR_IMAGE_POSITIONS");
        let mrope = MediaPiece::Image {
            n_tokens: 2,
            n_pos: 1,
            id: "m",
        };
        assert_eq!(code(&mut store, &mut kv, &[mrope]), "ERR_IMAGE_UNSUPPORTED");
        assert_eq!(kv.snapshot(), cells);
        assert_eq!(store.get(h).unwrap().position, 2);
    }

    fn span(start: Pos, n_pos: Pos) -> ImageSpan {
        ImageSpan {
            start,
            n_pos,
            id: Arc::from("x"),
        }
    }

    #[test]
    fn forks_keep_images_below_and_never_start_inside_one() {
        let images = [span(3, 16), span(25, 16)];
        assert_eq!(images_below(&images, 19), vec![span(3, 16)]);
        assert_eq!(images_below(&images, 18), vec![]);
        assert!(check_not_inside(&images, 3).is_ok());
        assert!(check_not_inside(&images, 19).is_ok());
        assert_eq!(
            check_not_inside(&images, 4).unwrap_err().code(),
            "ERR_IMAGE_POSITIONS"
        );
    }
}
