//! `createContext` and the module-level functions: option resolution, model loading (models
//! are shared between contexts on the same file), the calibration of machine-dependent plans,
//! logging and system info.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::context::{ContextInfo, Engine, Released, SessionContext};
use super::convert::{js, opt_int, Arg, Result};
use super::devices::{self, resolve_placement, OffloadInfo, Placement, PlacementInput};
use super::images::Images;
use super::worker::{self, rejected, Losable, Shared, Worker};
use crate::engine::calibrate;
use crate::engine::image_header::ImageLimits;
use crate::engine::kv_types::KvConfig;
use crate::engine::pool::Pool;
use crate::engine::store::BranchStore;
use crate::error::Error;
use crate::llama::{self, Context, ContextConfig, Model, POOLING_MEAN};

/// Options for {@link createContext}.
#[napi(object)]
pub struct ContextOptions {
    /// Path of a `.gguf` model file, or a `file:` URL. Contexts created on the same file with the
    /// same `useMmap` and placement share one loaded model; a model on RPC servers is loaded per
    /// context.
    pub model_path: String,
    /// KV cache size in cells (tokens, summed over all sequences). Default 2048; range 16 to 2^24.
    /// llama.cpp may round it up (read the effective value from `ctx.nCtx`).
    pub n_ctx: Option<f64>,
    /// Maximum tokens per `llama_decode` call. Default 512 (llama.cpp caps it at `nCtx`).
    pub n_batch: Option<f64>,
    /// CPU threads used by decodes. Default: the number of available CPU cores.
    pub n_threads: Option<f64>,
    /// Number of KV sequences, i.e. how many branches can be alive at once (one lease each).
    /// Default 1; range 1 to 256.
    pub n_seq_max: Option<f64>,
    /// Logits rows one decode may return. Default `nSeqMax + 16`; range `nSeqMax` to `nBatch`.
    /// A plain step needs one row per branch; a speculative step (`commitDrafts`) one per token
    /// it verifies, so raise it to run long drafts on many branches at once. Each row reserves
    /// `nVocab` floats of output buffer.
    pub n_outputs: Option<f64>,
    /// Create an embedding context: enables {@link SessionContext.encode} and
    /// {@link SessionContext.getEmbeddings}. Default false. Every token of a decode is an output
    /// row in such a context, so plain generation is slower there.
    pub embeddings: Option<bool>,
    /// Pooling type for embedding contexts. Default `PoolingType.MEAN` with embeddings, else `NONE`.
    #[napi(ts_type = "PoolingType")]
    pub pooling_type: Option<f64>,
    /// Memory-map the model file. Default true.
    pub use_mmap: Option<bool>,
    /// Sets the (process-wide) llama.cpp log level before loading. Default: silent (`'none'`), or `LLAMA_BRANCH_LOG`.
    #[napi(ts_type = "LogLevel")]
    pub log_level: Option<String>,
    /// Layers placed on the GPU / RPC devices, counted from the output end: 0 to the model's layers
    /// + 1 (the output layer). Default: all of them when such a device takes part, else 0 (ignored
    /// when there is none). More than the model has: `ERR_DEVICE` (before anything loads).
    pub n_gpu_layers: Option<f64>,
    /// Index (into the offload devices) of the device for `splitMode: 'none'` and row-split results. Default 0.
    pub main_gpu: Option<f64>,
    /// How layers spread over several devices: `'none'` (all on `mainGpu`), `'layer'` (whole
    /// layers per device; the default) or `'row'` (the rows of each matrix across the devices,
    /// where the backend supports it, e.g. CUDA).
    #[napi(ts_type = "'none' | 'layer' | 'row'")]
    pub split_mode: Option<String>,
    /// Relative share of the offloaded layers per device, one number per offload device in order
    /// (`ctx.offload.devices`), e.g. `[1, 3]`. Default: by free memory. A wrong length: `ERR_DEVICE`.
    pub tensor_split: Option<Vec<f64>>,
    /// Names (from {@link listDevices}) of the GPU / RPC devices to place layers on, in order.
    /// Default: every local GPU, then the `rpcServers`' devices; `[]`: none, the CPU alone (as
    /// `gpu: false`). Unknown names and the CPU: `ERR_DEVICE`.
    pub devices: Option<Vec<String>>,
    /// llama.cpp RPC servers (`"host:port"`, IPv4 or a host name; started with
    /// `npx llama-branch rpc-server`) whose devices take layers. Each is parsed and probed before
    /// use: malformed → `ERR_INVALID_ARG`, not answering → `ERR_RPC_UNREACHABLE`. If a server dies
    /// later, contexts using it are lost (`ERR_CONTEXT_LOST`); see docs/gpu-and-rpc.md, "Multi-host (RPC)".
    pub rpc_servers: Option<Vec<String>>,
    /// A Jinja chat template used instead of the model's own by every chat call of the context:
    /// `formatChat` without a `templateOverride` of its own, `getTurnSeparator`, chat requests and
    /// programs of a Scheduler on it, the server (`llama-branch serve --chat-template-file`). For
    /// models whose template lacks what you need (a thinking section, tool calls). One llama.cpp
    /// cannot parse or render: `ERR_CHAT_TEMPLATE` when the context is created.
    pub chat_template: Option<String>,
    /// Element type of the KV cache's keys: `'f16'` (default), `'q8_0'` (8.5 bits a value: about
    /// half the memory) or `'q4_0'` (4.5 bits: about a quarter). A type the model's attention
    /// heads cannot hold in whole blocks of 32: `ERR_INVALID_ARG`. Read back from `ctx.typeK`.
    #[napi(ts_type = "'f16' | 'q8_0' | 'q4_0'")]
    pub type_k: Option<String>,
    /// Element type of the KV cache's values, as `typeK`. A quantized V cache needs flash
    /// attention: with `flashAttention: 'off'` it is `ERR_INVALID_ARG`; with `'auto'` it turns
    /// flash attention on.
    #[napi(ts_type = "'f16' | 'q8_0' | 'q4_0'")]
    pub type_v: Option<String>,
    /// Flash attention (attention as one fused op): `'auto'` (default: llama.cpp turns it on where
    /// the backend runs the op on the layers' own devices), `'on'` or `'off'`. Read back from
    /// `ctx.flashAttention` (what was asked, or `'on'` when a quantized V cache forces it).
    #[napi(ts_type = "'auto' | 'on' | 'off'")]
    pub flash_attention: Option<String>,
    /// Bitwise-reproducible logits: a sequence's logits at a position are the same bits whatever
    /// else its decodes hold (1 to 64 rows, prefill and decode rows, any order), whether its
    /// prefix came from a prefill in any chunking, a fork, the prefix cache, the RAM or disk tier
    /// or a restored tree, for a given model, context settings and `nThreads`. Default false.
    /// It turns off the CPU backend's repacked weight layouts (the model is then loaded apart
    /// from contexts that keep them) and its batch-shaped kernels, and needs flash attention
    /// (`'auto'` becomes `'on'`; `'off'` is `ERR_INVALID_ARG`). Costs and measurements:
    /// docs/determinism.md. Read back from `ctx.deterministic`.
    pub deterministic: Option<bool>,
    /// Path of the model's image projector (an mmproj `.gguf`, llama.cpp's tools/mtmd), loaded
    /// beside the model so prompts may hold images (`ctx.tokenizeParts`, `branch.prefill`). One
    /// whose output width is not the model's: `ERR_PROJECTOR_MISMATCH`; any other file llama.cpp
    /// refuses: `ERR_PROJECTOR_LOAD`. Models whose images use M-RoPE positions (Qwen-VL):
    /// `ERR_IMAGE_UNSUPPORTED`.
    pub mmproj_path: Option<String>,
    /// Largest image file accepted, in bytes (default 20 MiB): larger is `ERR_IMAGE_TOO_LARGE`.
    pub image_max_bytes: Option<f64>,
    /// Most pixels (width × height, read from the file's header before decoding) an image may
    /// have (default 4096 × 4096): more is `ERR_IMAGE_TOO_LARGE`.
    pub image_max_pixels: Option<f64>,
}

// ---------------------------------------------------------------------------------------------
// Model sharing: contexts on the same file and load settings share one llama_model.

type ModelKey = (String, bool, bool, String);

fn acquire_model(
    path: &str,
    use_mmap: bool,
    repack_weights: bool,
    placement: &Placement,
) -> crate::error::Result<(Arc<Model>, OffloadInfo)> {
    type Cache = HashMap<ModelKey, (Weak<Model>, OffloadInfo)>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let block_count = || {
        llama::gguf_block_count(path).ok_or_else(|| {
            Error::ModelLoad(format!("{path} (no <arch>.block_count in the GGUF header)"))
        })
    };
    if !placement.endpoints.is_empty() {
        // Models on RPC servers are neither shared nor loaded under the cache lock: a server that
        // dies during the load leaves this thread parked for good (see napi/devices.rs), and
        // every later load must not wait for it.
        let (params, offload) = placement.model_params(use_mmap, repack_weights, block_count()?)?;
        let mut model = Model::load(path, &params)?;
        let endpoints = placement.endpoints.clone();
        model.set_free_check(move || devices::servers_answer(&endpoints));
        return Ok((Arc::new(model), offload));
    }
    // Holding the lock across a load makes a second caller wait and then share the result.
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| Error::Internal("model cache lock poisoned".into()))?;
    let key = (path.to_string(), use_mmap, repack_weights, placement.key());
    if let Some((model, offload)) = cache
        .get(&key)
        .and_then(|(w, o)| w.upgrade().map(|m| (m, o.clone())))
    {
        return Ok((model, offload));
    }
    let (params, offload) = placement.model_params(use_mmap, repack_weights, block_count()?)?;
    let model = Arc::new(Model::load(path, &params)?);
    cache.retain(|_, (w, _)| w.strong_count() > 0);
    cache.insert(key, (Arc::downgrade(&model), offload.clone()));
    Ok((model, offload))
}

fn check_model_file(path: &str) -> crate::error::Result<()> {
    use std::io::Read;
    let p = Path::new(path);
    if !p.is_file() {
        return Err(Error::ModelNotFound(path.to_string()));
    }
    let mut magic = [0u8; 4];
    let ok = std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok();
    if !ok || &magic != b"GGUF" {
        return Err(Error::ModelLoad(format!(
            "{path} (the file does not start with the GGUF magic bytes)"
        )));
    }
    Ok(())
}

/// `ContextOptions` resolved and validated.
struct Resolved {
    path: String,
    use_mmap: bool,
    /// Whether the CPU backend may repack the weights (off for deterministic contexts).
    repack_weights: bool,
    config: ContextConfig,
    log_level: Option<i32>,
    placement: Placement,
    chat_template: Option<String>,
    mmproj: Option<String>,
    image_limits: ImageLimits,
}

fn resolve_options(o: &ContextOptions) -> crate::error::Result<Resolved> {
    let path = o
        .model_path
        .strip_prefix("file://")
        .unwrap_or(&o.model_path)
        .to_string();
    if path.is_empty() {
        return Err(Error::invalid(
            "options.modelPath is required (a path to a .gguf file)",
        ));
    }
    let n_ctx = opt_int("nCtx", o.n_ctx, 2048, 16, 1 << 24)? as u32;
    let n_batch = opt_int("nBatch", o.n_batch, 512, 1, 1 << 20)? as u32;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as i64;
    let n_threads = opt_int("nThreads", o.n_threads, cores, 1, 1024)? as i32;
    let n_seq_max = opt_int("nSeqMax", o.n_seq_max, 1, 1, 256)? as u32;
    let embeddings = o.embeddings.unwrap_or(false);
    let pooling_type = opt_int(
        "poolingType",
        o.pooling_type,
        if embeddings { 1 } else { 0 },
        -1,
        4,
    )? as i32;
    // llama.cpp builds mean pooling's graph for nBatch / nSeqMax tokens per sequence and
    // aborts while reserving it when that does not divide (ggml_can_mul_mat).
    if embeddings && pooling_type == POOLING_MEAN && !n_batch.is_multiple_of(n_seq_max) {
        return Err(Error::invalid(format!(
            "a mean-pooled embedding context needs nBatch a multiple of nSeqMax (got nBatch {n_batch}, nSeqMax {n_seq_max}): e.g. nBatch {} with nSeqMax {n_seq_max}",
            n_batch.div_ceil(n_seq_max) * n_seq_max
        )));
    }
    let log_level = o.log_level.as_deref().map(log_level_from).transpose()?;
    let kv = KvConfig::resolve(
        o.type_k.as_deref(),
        o.type_v.as_deref(),
        o.flash_attention.as_deref(),
    )?;
    let deterministic = o.deterministic.unwrap_or(false);
    let kv = if deterministic {
        kv.deterministic()?
    } else {
        kv
    };
    let (repack_weights, reference_kernels) = if deterministic {
        (false, true)
    } else {
        diagnostic_kernels()
    };
    let placement = resolve_placement(&PlacementInput {
        n_gpu_layers: o.n_gpu_layers,
        main_gpu: o.main_gpu,
        split_mode: o.split_mode.as_deref(),
        tensor_split: o.tensor_split.as_deref(),
        devices: o.devices.as_deref(),
        rpc_servers: o.rpc_servers.as_deref(),
    })?;
    // A plain step outputs one logits row per branch and a speculative step one per verified
    // token; embedding contexts output every token. Sizing this by n_batch would reserve
    // n_batch × n_vocab floats of compute buffer (≈ 0.5 GB for a 262k vocabulary), so the
    // default leaves room for one 16-token draft beside a row for every sequence.
    let n_outputs_max = if embeddings {
        n_batch
    } else {
        let low = n_seq_max.max(1);
        let high = n_batch.max(low);
        let default = (low + DRAFT_ROWS).min(high);
        opt_int(
            "nOutputs",
            o.n_outputs,
            default as i64,
            low as i64,
            high as i64,
        )? as u32
    };
    Ok(Resolved {
        path,
        use_mmap: o.use_mmap.unwrap_or(true),
        repack_weights,
        config: ContextConfig {
            n_ctx,
            n_batch,
            n_seq_max,
            n_threads,
            embeddings,
            pooling_type,
            n_outputs_max,
            kv,
            reference_kernels,
        },
        log_level,
        placement,
        chat_template: o.chat_template.clone().filter(|t| !t.is_empty()),
        mmproj: o
            .mmproj_path
            .as_deref()
            .map(|p| p.strip_prefix("file://").unwrap_or(p).to_string())
            .filter(|p| !p.is_empty()),
        image_limits: ImageLimits {
            max_bytes: opt_int(
                "imageMaxBytes",
                o.image_max_bytes,
                ImageLimits::default().max_bytes as i64,
                1,
                1 << 40,
            )? as u64,
            max_pixels: opt_int(
                "imageMaxPixels",
                o.image_max_pixels,
                ImageLimits::default().max_pixels as i64,
                1,
                1 << 40,
            )? as u64,
        },
    })
}

/// For bench/determinism.js, which measures each source of batch-variance apart: with
/// `LLAMA_BRANCH_DIAG_KERNELS` holding `norepack` and/or `ref` (comma-separated), a context that
/// is not deterministic turns off only the repacked weights, or only the batch-shaped kernels.
/// Returns (repack weights, reference kernels); unset: the defaults (true, false).
fn diagnostic_kernels() -> (bool, bool) {
    let parts = std::env::var("LLAMA_BRANCH_DIAG_KERNELS").unwrap_or_default();
    let has = |p: &str| parts.split(',').any(|x| x.trim() == p);
    (!has("norepack"), has("ref"))
}

fn log_level_from(level: &str) -> crate::error::Result<i32> {
    llama::parse_log_level(level).ok_or_else(|| {
        Error::invalid(format!(
            "logLevel must be one of none, error, warn, info, debug; got \"{level}\""
        ))
    })
}

/// Whether pairs of single-token branches decode faster as two 1-row batches with this model,
/// thread count and device: measured on the new context's empty sequences, once per process.
fn measure_pair_plan(ctx: &mut Context, r: &Resolved) -> crate::error::Result<bool> {
    if r.config.n_seq_max < 2 || r.config.embeddings {
        return Ok(false);
    }
    // The kernels a context runs change which plan is faster, so they are part of the key.
    let key = format!(
        "{}|{}|{}|{}|{}",
        r.path, r.use_mmap, r.config.n_threads, r.repack_weights, r.config.reference_kernels
    );
    let token = ctx.model.bos_token().unwrap_or(0);
    calibrate::cached(&key, || calibrate::pair_split_is_faster(ctx, token))
}

/// Output rows the default `nOutputs` leaves for drafts beyond one row per sequence.
const DRAFT_ROWS: u32 = 16;

fn load_context(
    resolved: Resolved,
    shared: Arc<Shared<Engine>>,
    worker: Worker,
) -> crate::error::Result<SessionContext> {
    check_model_file(&resolved.path)?;
    if let Some(template) = &resolved.chat_template {
        crate::llama::chat::verify_template(template).map_err(|e| {
            Error::ChatTemplate(format!(
                "options.chatTemplate: llama.cpp cannot parse or render it ({e}); pass a Jinja chat template, or leave it out for the model's own"
            ))
        })?;
    }
    let (model, offload) = acquire_model(
        &resolved.path,
        resolved.use_mmap,
        resolved.repack_weights,
        &resolved.placement,
    )?;
    let mut ctx = Context::new(model.clone(), &resolved.config)?;
    let split_pairs = measure_pair_plan(&mut ctx, &resolved)?;
    let info = ContextInfo {
        n_ctx: ctx.n_ctx(),
        n_batch: ctx.n_batch(),
        n_seq_max: ctx.n_seq_max(),
        n_outputs: resolved.config.n_outputs_max,
        n_vocab: model.n_vocab,
        embeddings: resolved.config.embeddings,
        pooling: ctx.pooling_type(),
        kv: resolved.config.kv,
        causal: model.encoder_arch().is_none(),
    };
    let images = match &resolved.mmproj {
        Some(path) => Images::load(
            path,
            model.clone(),
            resolved.config.n_threads,
            resolved.image_limits,
        )?,
        None => Images::none(resolved.image_limits),
    };
    let image_counters = images.counters();
    let endpoints = resolved.placement.endpoints.clone();
    let pool = Pool::new(ctx.n_threads());
    let store = BranchStore::new(info.n_seq_max, split_pairs);
    let released = Released::default();
    *shared
        .engine
        .lock()
        .map_err(|_| Error::Internal("lock poisoned".into()))? =
        Some(Engine::new(ctx, store, pool, released.clone(), images));
    let weak: Weak<dyn Losable> = Arc::downgrade(&shared) as Weak<dyn Losable>;
    devices::watch(&endpoints, weak);
    let mut session = SessionContext::new(
        shared,
        worker,
        info,
        released,
        model,
        offload,
        resolved.chat_template,
    );
    session.image_counters = image_counters;
    Ok(session)
}

/// Loads the model (shared with contexts on the same file) and creates a context, off the
/// main thread. Rejects with a coded error; never throws.
#[napi(js_name = "createContext", ts_return_type = "Promise<SessionContext>")]
pub fn create_context<'env>(
    env: &'env Env,
    #[napi(ts_arg_type = "ContextOptions")] options: Arg<ContextOptions>,
) -> Result<Object<'env>> {
    let resolved = options
        .get(
            "createContext: options",
            "a ContextOptions object with a string modelPath",
        )
        .and_then(|o| resolve_options(&o));
    let resolved = match resolved {
        Ok(r) => r,
        Err(e) => return rejected::<SessionContext>(env, e),
    };
    if let Some(level) = resolved.log_level {
        llama::set_log_threshold(level);
    }
    let (settle, promise) = worker::deferred::<SessionContext>(env)?;
    let shared: Arc<Shared<Engine>> = Arc::new(Shared::default());
    let worker = Worker::spawn(shared.clone(), "llama-branch-ctx".into()).map_err(|e| {
        js(Error::Internal(format!(
            "cannot start the worker thread: {e}"
        )))
    })?;
    // The load runs on a short-lived loader thread. On success the session (which owns the
    // worker) travels to JS through the resolver; a failed load drops the worker, whose thread
    // then exits.
    // The promise settles once: by the loader, or by the RPC watchdog if a server dies during
    // the load (the loader thread then never returns; see napi/devices.rs).
    type Settle = Box<dyn FnOnce(crate::error::Result<SessionContext>) + Send>;
    let slot: Arc<Mutex<Option<Settle>>> = Arc::new(Mutex::new(Some(Box::new(settle))));
    let lost_slot = slot.clone();
    let on_lost = devices::OnLost::new(move |reason: &str| {
        let settle = lost_slot.lock().ok().and_then(|mut s| s.take());
        if let Some(settle) = settle {
            settle(Err(Error::RpcUnreachable(format!(
                "the model could not be loaded: {reason}"
            ))));
        }
    });
    devices::watch(
        &resolved.placement.endpoints,
        Arc::downgrade(&on_lost) as Weak<dyn Losable>,
    );
    std::thread::Builder::new()
        .name("llama-branch-load".into())
        .spawn(move || {
            let result = worker::run_guarded(|| load_context(resolved, shared, worker));
            drop(on_lost);
            let settle = slot.lock().ok().and_then(|mut s| s.take());
            if let Some(settle) = settle {
                settle(result);
            }
        })
        .map_err(|e| {
            js(Error::Internal(format!(
                "cannot start the loader thread: {e}"
            )))
        })?;
    Ok(promise)
}

#[napi(js_name = "setLogLevel")]
pub fn set_log_level(level: String) -> Result<()> {
    llama::set_log_threshold(log_level_from(&level).map_err(js)?);
    Ok(())
}

#[napi(js_name = "systemInfo")]
pub fn system_info() -> String {
    llama::system_info()
}

/// Called by the JS loader (lib/loader.js) right after loading the addon, with the folder of the
/// .node: a prebuilt's backend modules sit there. Returns the number of compute devices.
#[napi(js_name = "_setBackendDir")]
pub fn set_backend_dir(dir: String) -> u32 {
    llama::init_backend_from_dir(&dir) as u32
}

/// What loading one more backend module did: the devices it registered, or why it did not load.
#[napi(object)]
pub struct ModuleLoad {
    /// The module registered its backend.
    pub loaded: bool,
    /// Devices the backend registered (0 when it loaded but found none).
    pub devices: u32,
    /// Why it did not load (the dynamic loader's or ggml's message).
    pub error: Option<String>,
}

/// Called by the JS loader for a GPU backend shipped in its own package (e.g. the Vulkan module
/// of llama-branch-linux-x64-gnu-vulkan), after `_setBackendDir`. Never throws for a module that
/// fails: the reason comes back.
#[napi(js_name = "_loadBackendModule")]
pub fn load_backend_module(path: String) -> ModuleLoad {
    match llama::load_module(&path) {
        Ok(devices) => ModuleLoad {
            loaded: true,
            devices: devices as u32,
            error: None,
        },
        Err(error) => ModuleLoad {
            loaded: false,
            devices: 0,
            error: Some(error),
        },
    }
}

/// Every error `code` the addon can produce (for tooling and the typings test).
#[napi(js_name = "errorCodes")]
pub fn error_codes() -> Vec<&'static str> {
    Error::codes()
}
