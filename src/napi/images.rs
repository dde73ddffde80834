//! Images (issue 49): the projector a context loads beside its model (`mmprojPath`), prompts of
//! text and images (`_tokenizeParts` → a `MediaPrompt` holding the tokenized chunks), their
//! prefill into a branch (`_branchPrefillMedia`), and the encoder counters (`imageStats`).
//! Decoding, tokenizing and encoding images all run on the context's worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::cancel::{run_cancellable, CancelArg};
use super::context::{Engine, SessionContext};
use super::convert::{Arg, Result};
use crate::engine::image_header::{self, Format, ImageLimits};
use crate::engine::media::{ImageSource, ImageSpan, MediaPiece};
use crate::error::Error;
use crate::llama::{Bitmap, Chunks, Model, Part, Piece, Projector};

/// Encoder runs and their time, shared by the engine (which counts) and the JS object (which
/// reads them without waiting for the worker).
#[derive(Default)]
pub struct Counters {
    encodes: AtomicU64,
    encode_ns: AtomicU64,
    images: AtomicU64,
}

/// The engine's image side: the projector, if one was loaded, and the size limits.
pub struct Images {
    projector: Option<Projector>,
    counters: Option<Arc<Counters>>,
    limits: ImageLimits,
}

impl Images {
    pub fn none(limits: ImageLimits) -> Images {
        Images {
            projector: None,
            counters: None,
            limits,
        }
    }

    pub fn load(
        path: &str,
        model: Arc<Model>,
        n_threads: i32,
        limits: ImageLimits,
    ) -> crate::error::Result<Images> {
        Ok(Images {
            projector: Some(Projector::load(path, model, n_threads, true)?),
            counters: Some(Arc::default()),
            limits,
        })
    }

    pub fn counters(&self) -> Option<Arc<Counters>> {
        self.counters.clone()
    }

    fn projector(&self) -> crate::error::Result<&Projector> {
        self.projector.as_ref().ok_or(Error::NoProjector)
    }
}

/// One part of a prompt, as JS gives it (lib/ turns a string into `{ text }`).
#[napi(object)]
pub struct PromptPartInput {
    pub text: Option<String>,
    /// An image file's bytes (PNG, JPEG, GIF or BMP).
    pub image: Option<Uint8Array>,
    /// A path to an image file, read on the worker.
    pub image_path: Option<String>,
}

/// One piece of a tokenized prompt.
#[napi(object)]
pub struct PromptPiece {
    /// `'text'` or `'image'`.
    #[napi(ts_type = "'text' | 'image'")]
    pub r#type: String,
    /// A text piece's token ids.
    pub tokens: Option<Vec<i32>>,
    /// Positions the piece takes in a sequence (a text piece: its token count).
    pub n_pos: i32,
    /// An image's embedding rows (equal to `nPos` for the models supported).
    pub n_tokens: Option<u32>,
    /// An image's SHA-256 (hex) of its file bytes.
    pub id: Option<String>,
}

/// Where an image sits in a branch's sequence (a prefix-cache entry carries its images'
/// places so that a state restored from RAM or a file knows them again).
#[napi(object)]
pub struct ImageSpanObject {
    /// Its first position.
    pub start: u32,
    /// Positions it takes.
    pub n_pos: u32,
    /// The SHA-256 (hex) of the image file's bytes.
    pub id: String,
}

impl ImageSpanObject {
    /// The span as the engine holds it (unchecked: `spans_from` checks).
    pub(super) fn span(&self) -> ImageSpan {
        ImageSpan {
            start: self.start.min(i32::MAX as u32) as i32,
            n_pos: self.n_pos.min(i32::MAX as u32) as i32,
            id: Arc::from(self.id.as_str()),
        }
    }

    pub(super) fn of(s: &ImageSpan) -> ImageSpanObject {
        ImageSpanObject {
            start: s.start as u32,
            n_pos: s.n_pos as u32,
            id: s.id.to_string(),
        }
    }
}

/// Spans given by JS as a branch's images over its first `len` positions, checked
/// (ERR_INVALID_ARG naming `what`).
pub(super) fn spans_from(
    spans: Option<Vec<ImageSpanObject>>,
    len: i64,
    what: &str,
) -> crate::error::Result<Vec<ImageSpan>> {
    let spans: Vec<ImageSpan> = spans
        .unwrap_or_default()
        .iter()
        .map(ImageSpanObject::span)
        .collect();
    match crate::engine::media::spans_problem(&spans, len.clamp(0, i32::MAX as i64) as i32) {
        Some(why) => Err(Error::invalid(format!("{what}: {why}"))),
        None => Ok(spans),
    }
}

/// A prompt of text and images, tokenized by the context's projector: text runs as token ids
/// and images as chunks the projector encodes when the prompt is prefilled.
#[napi]
pub struct MediaPrompt {
    chunks: Arc<Chunks>,
    pieces: Vec<Piece>,
    /// The counters of the context that tokenized it (its identity, for a foreign-prompt check).
    owner: Arc<Counters>,
}

#[napi]
impl MediaPrompt {
    /// The pieces in order: text runs (their tokens) and images (positions, id).
    #[napi(getter)]
    pub fn pieces(&self) -> Vec<PromptPiece> {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::Text(tokens) => PromptPiece {
                    r#type: "text".into(),
                    tokens: Some(tokens.clone()),
                    n_pos: tokens.len() as i32,
                    n_tokens: None,
                    id: None,
                },
                Piece::Image {
                    n_tokens,
                    n_pos,
                    id,
                } => PromptPiece {
                    r#type: "image".into(),
                    tokens: None,
                    n_pos: *n_pos,
                    n_tokens: Some(*n_tokens as u32),
                    id: Some(id.clone()),
                },
            })
            .collect()
    }

    /// Positions the whole prompt takes in a sequence.
    #[napi(getter)]
    pub fn n_pos(&self) -> i32 {
        self.pieces.iter().map(positions).sum()
    }

    /// Images in the prompt.
    #[napi(getter)]
    pub fn n_images(&self) -> u32 {
        self.pieces
            .iter()
            .filter(|p| matches!(p, Piece::Image { .. }))
            .count() as u32
    }
}

fn positions(p: &Piece) -> i32 {
    match p {
        Piece::Text(t) => t.len() as i32,
        Piece::Image { n_pos, .. } => *n_pos,
    }
}

/// Encoder counters of a context (`ctx.imageStats()`).
#[napi(object)]
pub struct ImageStats {
    /// Images tokenized (decoded from their files).
    pub images: f64,
    /// Vision encoder runs: one per image prefilled, none for a fork after it.
    pub encodes: f64,
    /// Milliseconds spent in the encoder, in total.
    pub encode_ms: f64,
}

enum PartData {
    Text(String),
    Bytes(Vec<u8>),
    Path(String),
}

/// The image's bytes, checked against the limits (a file's size before reading it).
fn image_bytes(data: PartData, limits: &ImageLimits) -> crate::error::Result<Vec<u8>> {
    match data {
        PartData::Bytes(b) => Ok(b),
        PartData::Path(path) => {
            let meta = std::fs::metadata(&path)
                .map_err(|e| Error::invalid(format!("cannot read the image file {path}: {e}")))?;
            if meta.len() > limits.max_bytes {
                return Err(Error::ImageTooLarge(format!(
                    "the image file {path} is {} bytes, over the limit of {} (option imageMaxBytes); send a smaller file",
                    meta.len(),
                    limits.max_bytes
                )));
            }
            std::fs::read(&path)
                .map_err(|e| Error::invalid(format!("cannot read the image file {path}: {e}")))
        }
        PartData::Text(_) => unreachable!("text is not an image"),
    }
}

/// The projector as the engine's `ImageSource` for one prefill.
struct Encoder<'a> {
    projector: &'a mut Projector,
    chunks: &'a Chunks,
    counters: &'a Counters,
}

impl ImageSource for Encoder<'_> {
    fn n_embd(&self) -> usize {
        self.projector.n_embd()
    }
    fn encode(&mut self, i: usize) -> crate::error::Result<Vec<f32>> {
        let t0 = Instant::now();
        let out = self.projector.encode(self.chunks, i)?;
        self.counters.encodes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .encode_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(out)
    }
    fn non_causal(&self, i: usize) -> bool {
        self.projector.non_causal(self.chunks, i)
    }
}

#[napi]
impl SessionContext {
    /// Whether the context loaded an image projector (`mmprojPath`).
    #[napi(getter)]
    pub fn has_projector(&self) -> bool {
        self.image_counters.is_some()
    }

    /// Encoder counters; zeros without a projector. Never waits.
    #[napi]
    pub fn image_stats(&self) -> ImageStats {
        let (images, encodes, ns) = self.image_counters.as_ref().map_or((0, 0, 0), |c| {
            (
                c.images.load(Ordering::Relaxed),
                c.encodes.load(Ordering::Relaxed),
                c.encode_ns.load(Ordering::Relaxed),
            )
        });
        ImageStats {
            images: images as f64,
            encodes: encodes as f64,
            encode_ms: ns as f64 / 1e6,
        }
    }

    /// Tokenizes a prompt of text and images on the worker (images decoded, checked against the
    /// limits and preprocessed; not encoded yet).
    #[napi(
        js_name = "_tokenizeParts",
        ts_args_type = "parts: PromptPartInput[], addSpecial?: boolean",
        ts_return_type = "Promise<MediaPrompt>"
    )]
    pub fn _tokenize_parts<'env>(
        &self,
        env: &'env Env,
        parts: Arg<Vec<PromptPartInput>>,
        add_special: Arg<Option<bool>>,
    ) -> Result<Object<'env>> {
        let counters = self.image_counters.clone();
        self.spawn_keeping_logits(env, || {
            let parts = parts.get("tokenizeParts: parts", "an array of prompt parts")?;
            let add_special = add_special
                .get("tokenizeParts: addSpecial", "a boolean")?
                .unwrap_or(true);
            let counters = counters.ok_or(Error::NoProjector)?;
            let mut data = Vec::with_capacity(parts.len());
            for (i, p) in parts.into_iter().enumerate() {
                data.push(match (p.text, p.image, p.image_path) {
                    (Some(t), None, None) => PartData::Text(t),
                    (None, Some(b), None) => PartData::Bytes(b.to_vec()),
                    (None, None, Some(path)) => PartData::Path(path),
                    _ => {
                        return Err(Error::invalid(format!(
                            "tokenizeParts: part {i} must have exactly one of text, image (bytes) or imagePath"
                        )))
                    }
                });
            }
            Ok(move |e: &mut Engine| {
                let limits = e.images.limits;
                let projector = e.images.projector()?;
                let mut loaded = Vec::with_capacity(data.len());
                for d in data {
                    loaded.push(match d {
                        PartData::Text(t) => Loaded::Text(t),
                        image => {
                            let bytes = image_bytes(image, &limits)?;
                            let (format, _, _) = image_header::check(&bytes, &limits)?;
                            let bitmap = match format {
                                Format::Webp => {
                                    let (nx, ny, rgb) = image_header::decode_webp(&bytes)?;
                                    Bitmap::from_rgb(nx, ny, &rgb, &image_header::file_id(&bytes))?
                                }
                                _ => projector.decode_image(&bytes)?,
                            };
                            let (nx, ny) = bitmap.size();
                            // The header was checked; the decoder's own size is checked too.
                            if u64::from(nx) * u64::from(ny) > limits.max_pixels {
                                return Err(Error::ImageTooLarge(format!(
                                    "the image decodes to {nx}×{ny} pixels, over the limit of {} (option imageMaxPixels); scale it down first",
                                    limits.max_pixels
                                )));
                            }
                            Loaded::Image(bitmap)
                        }
                    });
                }
                let parts: Vec<Part> = loaded
                    .iter()
                    .map(|l| match l {
                        Loaded::Text(t) => Part::Text(t),
                        Loaded::Image(b) => Part::Image(b),
                    })
                    .collect();
                let chunks = projector.tokenize(&parts, add_special)?;
                let pieces: Vec<Piece> = (0..chunks.len()).map(|i| chunks.piece(i)).collect();
                let n_images = loaded.iter().filter(|l| matches!(l, Loaded::Image(_))).count();
                counters.images.fetch_add(n_images as u64, Ordering::Relaxed);
                Ok(MediaPrompt {
                    chunks: Arc::new(chunks),
                    pieces,
                    owner: counters,
                })
            })
        })
    }

    /// Prefill of a `MediaPrompt` into one branch: text runs decoded as a prefill, each image
    /// encoded then decoded as one batch of embedding rows. All or nothing. `from`/`to`: the
    /// prompt's positions to prefill (default: all), e.g. the rest after a cached start; a range
    /// that cuts an image is ERR_IMAGE_POSITIONS.
    #[napi(js_name = "_branchPrefillMedia", ts_return_type = "Promise<void>")]
    pub fn _branch_prefill_media<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] handle: Arg<f64>,
        #[napi(ts_arg_type = "MediaPrompt")] prompt: Arg<ClassInstance<'env, MediaPrompt>>,
        #[napi(ts_arg_type = "CancelToken | undefined")] cancel: CancelArg,
        #[napi(ts_arg_type = "number | undefined")] from: Arg<Option<f64>>,
        #[napi(ts_arg_type = "number | undefined")] to: Arg<Option<f64>>,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let prompt = prompt.get("prefill: prompt", "a MediaPrompt")?;
            let handle = handle.get("prefill: handle", "a branch handle")?;
            let (from, to) = (
                from.get("prefill: from", "a number")?,
                to.get("prefill: to", "a number")?,
            );
            let job = self.media_job(handle, &prompt, from, to)?;
            let counters = self.image_counters.clone().ok_or(Error::NoProjector)?;
            let flag = cancel.get("_branchPrefillMedia")?;
            Ok(move |e: &mut Engine| {
                run_cancellable(e, flag, |e, cancel| job.run(e, &counters, cancel))
            })
        })
    }

    /// The media prefills of one Scheduler step in ONE worker job: entry `i` prefills
    /// `prompts[i]`'s positions `froms[i]..tos[i]` into branch `handles[i]`, each all or nothing
    /// as `_branchPrefillMedia`. Resolves with one item per entry: null, or the failure of that
    /// entry alone (its code and message), so one request's bad image never fails the others.
    /// Malformed arguments reject the whole call before anything runs.
    #[napi(
        js_name = "_storePrefillMedia",
        ts_return_type = "Promise<Array<MediaPrefillFailure | null>>"
    )]
    pub fn _store_prefill_media<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number[]")] handles: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "MediaPrompt[]")] prompts: Arg<Vec<ClassInstance<'env, MediaPrompt>>>,
        #[napi(ts_arg_type = "number[]")] froms: Arg<Vec<f64>>,
        #[napi(ts_arg_type = "number[]")] tos: Arg<Vec<f64>>,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let what = "an array of the same length as handles";
            let handles =
                handles.get("_storePrefillMedia: handles", "an array of branch handles")?;
            let prompts = prompts.get("_storePrefillMedia: prompts", "an array of MediaPrompts")?;
            let froms = froms.get("_storePrefillMedia: froms", what)?;
            let tos = tos.get("_storePrefillMedia: tos", what)?;
            let n = handles.len();
            if prompts.len() != n || froms.len() != n || tos.len() != n {
                return Err(Error::invalid(
                    "_storePrefillMedia: give one prompt, from and to per branch handle",
                ));
            }
            let jobs = (0..n)
                .map(|i| self.media_job(handles[i], &prompts[i], Some(froms[i]), Some(tos[i])))
                .collect::<crate::error::Result<Vec<_>>>()?;
            let counters = self.image_counters.clone().ok_or(Error::NoProjector)?;
            Ok(move |e: &mut Engine| {
                run_cancellable(e, None, |e, cancel| {
                    let mut failures = Vec::with_capacity(jobs.len());
                    for job in &jobs {
                        failures.push(
                            job.run(e, &counters, cancel)
                                .err()
                                .map(MediaPrefillFailure::of),
                        );
                    }
                    Ok(failures)
                })
            })
        })
    }

    /// One media prefill checked on the JS thread: the branch, the prompt's pieces and the range.
    fn media_job(
        &self,
        handle: f64,
        prompt: &MediaPrompt,
        from: Option<f64>,
        to: Option<f64>,
    ) -> crate::error::Result<MediaJob> {
        let whole = prompt.n_pos() as f64;
        let position = |v: Option<f64>, default: f64, name: &str| match v.unwrap_or(default) {
            p if p.is_finite() && p.fract() == 0.0 && (0.0..=whole).contains(&p) => Ok(p as i64),
            p => Err(Error::invalid(format!(
                "prefill: {name} must be an integer position in [0, {whole}] of the prompt, got {p}"
            ))),
        };
        let range = (position(from, 0.0, "from")?, position(to, whole, "to")?);
        let branch = self.ids.from_js(handle)?;
        let owner = self.image_counters.as_ref().ok_or(Error::NoProjector)?;
        if !Arc::ptr_eq(owner, &prompt.owner) {
            return Err(Error::invalid(
                "prefill: the prompt was tokenized by another context's projector; tokenize it with this context's tokenizeParts",
            ));
        }
        let (chunks, pieces) = (prompt.chunks.clone(), prompt.pieces.clone());
        Ok(MediaJob {
            branch,
            chunks,
            pieces,
            range,
        })
    }
}

/// What one entry's failure was, for JS to raise as a coded error on its owner.
#[napi(object)]
pub struct MediaPrefillFailure {
    pub code: String,
    pub message: String,
}

impl MediaPrefillFailure {
    fn of(e: Error) -> MediaPrefillFailure {
        MediaPrefillFailure {
            code: e.code().to_string(),
            message: e.to_string(),
        }
    }
}

/// One checked media prefill, run on the worker.
struct MediaJob {
    branch: crate::engine::handles::Handle,
    chunks: Arc<Chunks>,
    pieces: Vec<Piece>,
    range: (i64, i64),
}

impl MediaJob {
    /// Text runs decoded as a prefill, each image encoded then decoded (all or nothing).
    fn run(
        &self,
        e: &mut Engine,
        counters: &Counters,
        cancel: &dyn Fn() -> bool,
    ) -> crate::error::Result<()> {
        let Engine {
            ctx, store, images, ..
        } = e;
        let projector = images.projector.as_mut().ok_or(Error::NoProjector)?;
        let media: Vec<MediaPiece> = self
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => MediaPiece::Text(t),
                Piece::Image {
                    n_tokens,
                    n_pos,
                    id,
                } => MediaPiece::Image {
                    n_tokens: *n_tokens,
                    n_pos: *n_pos,
                    id,
                },
            })
            .collect();
        let mut encoder = Encoder {
            projector,
            chunks: &self.chunks,
            counters,
        };
        store.prefill_media(
            ctx,
            self.branch,
            &media,
            Some(self.range),
            &mut encoder,
            cancel,
        )
    }
}

enum Loaded {
    Text(String),
    Image(Bitmap),
}
