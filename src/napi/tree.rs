//! Branch trees in files, behind lib/BranchStore.js `saveTree` / `BranchStore.restoreTree`:
//! the jobs on the worker (serialising and parsing hundreds of MiB never runs on the JS thread).
//! The tree logic is engine/tree.rs, the payload engine/tree_file.rs, the container (header,
//! fingerprint, checksum, atomic write) engine/saved_state/.

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::context::{Engine, SessionContext};
use super::convert::{Arg, Result};
use super::saved_state::fingerprint_of;
use crate::engine::saved_state::{check_path, read_file, write_atomically, Limits};
use crate::engine::tree::restore_sampling;
use crate::engine::tree_file::{parse_tree_file, tree_file_bytes, SavedLogits, TreeFile};

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
                let bytes = read_file(&path)?;
                let limits = Limits { n_ctx, n_vocab };
                let here = fingerprint_of(&model, &kv);
                let tree = parse_tree_file(&path, &bytes, &limits, &here)?;
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
