//! Branch trees in files, behind lib/BranchStore.js `saveTree` / `BranchStore.restoreTree`:
//! the fingerprint of this context, the atomic write, and the jobs on the worker (serialising
//! and parsing hundreds of MiB never runs on the JS thread). The tree logic is
//! engine/tree.rs, the bytes engine/tree_file.rs.

use std::io::Write;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::context::{Engine, SessionContext};
use super::convert::{Arg, Result};
use crate::engine::fingerprint::Fingerprint;
use crate::engine::tree::restore_sampling;
use crate::engine::tree_file::{parse_tree_file, tree_file_bytes, Limits, SavedLogits, TreeFile};
use crate::error::Error;
use crate::llama::{Model, SEQ_FILE_VERSION};

/// What `store.saveTree` resolves (sizes in bytes).
#[napi(object)]
pub struct TreeSaved {
    /// Handles of the saved branches, root first, parents before children.
    pub handles: Vec<f64>,
    /// Size of the file.
    pub bytes: f64,
    /// Bytes of KV cells in it (each shared prefix once).
    pub kv_bytes: f64,
    /// Bytes of logits snapshots in it (a fork that has not moved shares its parent's).
    pub logits_bytes: f64,
    /// Branches saved with their parent's prefix left out.
    pub shared_branches: u32,
}

/// What `BranchStore.restoreTree` resolves.
#[napi(object)]
pub struct TreeRestored {
    /// Handles of the restored branches, in the saved order.
    pub handles: Vec<f64>,
    /// Each branch's parent as an index into `handles` (-1 for the root).
    pub parents: Vec<i32>,
    /// The `meta` text saved with the tree ('' when none).
    pub meta: String,
    /// Size of the file.
    pub bytes: f64,
}

/// This context's fingerprint: the model (size, parameters, GGUF metadata), llama.cpp's
/// sequence-state format and the KV settings that change a state's bytes.
pub(super) fn fingerprint_of(model: &Model, kv: &crate::engine::kv_types::KvConfig) -> Fingerprint {
    Fingerprint::new(
        model.size_bytes(),
        model.n_params(),
        &model.metadata(),
        &model.description(),
        SEQ_FILE_VERSION,
        format!(
            "typeK={} typeV={} flashAttention={}",
            kv.type_k.name(),
            kv.type_v.name(),
            kv.flash_attention.name()
        ),
    )
}

/// Writes `bytes` to `path` so that `path` is either its old self or the whole new file: a
/// temporary file beside it, fsync, rename over it, fsync of the folder (best effort).
fn write_atomically(path: &str, bytes: &[u8]) -> crate::error::Result<()> {
    let fail =
        |e: std::io::Error| Error::invalid(format!("cannot write the tree file {path}: {e}"));
    let target = std::path::Path::new(path);
    let name = target
        .file_name()
        .ok_or_else(|| Error::invalid(format!("{path} names no file")))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = target.with_file_name(format!(
        ".{}.{}-{nanos}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, target)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn check_path(where_: &str, path: &str) -> crate::error::Result<()> {
    if path.is_empty() {
        return Err(Error::invalid(format!(
            "{where_}: path must be a non-empty file path"
        )));
    }
    Ok(())
}

#[napi]
impl SessionContext {
    /// Saves `handle`'s branch and its live descendants to `path` (atomically).
    #[napi(js_name = "_storeSaveTree", ts_return_type = "Promise<TreeSaved>")]
    pub fn _store_save_tree<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number")] handle: Arg<f64>,
        #[napi(ts_arg_type = "string")] path: Arg<String>,
        #[napi(ts_arg_type = "string | undefined")] meta: Arg<Option<String>>,
    ) -> Result<Object<'env>> {
        let ids = self.ids;
        let model = Arc::clone(&self.model);
        let kv = self.info.kv;
        self.spawn_keeping_logits(env, || {
            let root = ids.from_js(handle.get("saveTree: root", "a Branch")?)?;
            let path = path.get("saveTree: path", "a file path")?;
            check_path("saveTree", &path)?;
            let meta = meta
                .get("saveTree: options.meta", "a string")?
                .unwrap_or_default();
            Ok(move |e: &mut Engine| {
                let order = e.store.subtree_order(root)?;
                let branches = e.store.save_tree(&e.ctx, root)?;
                let kv_bytes: usize = branches.iter().map(|b| b.kv.len()).sum();
                let logits_bytes: usize = branches
                    .iter()
                    .map(|b| match &b.logits {
                        SavedLogits::Own(row) => 4 * row.len(),
                        _ => 0,
                    })
                    .sum();
                let shared_branches = branches.iter().filter(|b| b.shared > 0).count() as u32;
                let tree = TreeFile {
                    fingerprint: fingerprint_of(&model, &kv),
                    meta,
                    branches,
                };
                let bytes = tree_file_bytes(&tree);
                write_atomically(&path, &bytes)?;
                Ok(TreeSaved {
                    handles: ids.to_js_all(&order),
                    bytes: bytes.len() as f64,
                    kv_bytes: kv_bytes as f64,
                    logits_bytes: logits_bytes as f64,
                    shared_branches,
                })
            })
        })
    }

    /// Restores a tree saved by `_storeSaveTree` onto free sequences of this context.
    #[napi(
        js_name = "_storeRestoreTree",
        ts_return_type = "Promise<TreeRestored>"
    )]
    pub fn _store_restore_tree<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "string")] path: Arg<String>,
    ) -> Result<Object<'env>> {
        let ids = self.ids;
        let model = Arc::clone(&self.model);
        let kv = self.info.kv;
        let (n_ctx, n_vocab) = (self.info.n_ctx, self.info.n_vocab);
        self.spawn(env, || {
            let path = path.get("restoreTree: path", "a file path")?;
            check_path("restoreTree", &path)?;
            Ok(move |e: &mut Engine| {
                let cannot = |err: std::io::Error| {
                    Error::invalid(format!("cannot open the tree file {path}: {err}"))
                };
                if !std::fs::metadata(&path).map_err(cannot)?.is_file() {
                    return Err(Error::invalid(format!(
                        "cannot open the tree file {path}: not a regular file"
                    )));
                }
                let bytes = std::fs::read(&path).map_err(cannot)?;
                let tree = parse_tree_file(&path, &bytes, &Limits { n_ctx, n_vocab })?;
                tree.fingerprint.check_matches(
                    &fingerprint_of(&model, &kv),
                    &format!("restoreTree({path})"),
                )?;
                let samplings = tree
                    .branches
                    .iter()
                    .map(|b| restore_sampling(&b.sampling, Some(&model), n_vocab, n_ctx))
                    .collect::<crate::error::Result<Vec<_>>>()?;
                let handles = e.store.restore_tree(&e.ctx, &tree.branches, samplings)?;
                Ok(TreeRestored {
                    handles: ids.to_js_all(&handles),
                    parents: tree
                        .branches
                        .iter()
                        .map(|b| b.parent.map_or(-1, |p| p as i32))
                        .collect(),
                    meta: tree.meta,
                    bytes: bytes.len() as f64,
                })
            })
        })
    }
}
