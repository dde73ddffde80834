//! Parked branches, behind lib/Branch.js `park`/`resume` and lib/BranchStore.js `park`,
//! `resume`, `parkStats` and `setParkSpill`: the jobs on the worker (copying cells in and out
//! of the KV cache never runs on the JS thread). The rules are engine/park.rs.

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::context::{Engine, SessionContext};
use super::convert::{js, Arg, Result};
use super::saved_state::fingerprint_of;

/// What `store.parkStats()` returns (sizes in bytes).
#[napi(object)]
pub struct ParkStatsInfo {
    /// Branches parked now.
    pub parked: u32,
    /// Host memory their cells, snapshots and kept sampling candidates take.
    pub ram_bytes: f64,
    /// Bytes of their spill files.
    pub disk_bytes: f64,
    /// Parked branches whose state is in a spill file.
    pub spilled: u32,
    /// Why the last spill failed (those branches stayed in RAM); null when none did.
    pub last_spill_error: Option<String>,
}

/// What `branch.parkedInfo` returns for a parked branch.
#[napi(object)]
pub struct ParkedInfo {
    /// Cells shared with its parent when parked (tagged back on resume, never copied).
    pub shared: u32,
    /// Its own cells, kept in RAM or in the spill file.
    pub own: u32,
    /// The spill file, while spilled; null while in RAM.
    pub file: Option<String>,
}

#[napi]
impl SessionContext {
    /// Parks the branches (children before parents); all or nothing.
    #[napi(js_name = "_storePark", ts_return_type = "Promise<void>")]
    pub fn _store_park<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number[]")] handles: Arg<Vec<f64>>,
    ) -> Result<Object<'env>> {
        self.spawn_keeping_logits(env, || {
            let handles = self
                .ids
                .from_js_all(&handles.get("park: branches", "an array of Branch objects")?)?;
            Ok(move |e: &mut Engine| e.store.park(&e.ctx, &handles))
        })
    }

    /// Resumes the branches and the parked ancestors they need; resolves every handle resumed.
    #[napi(js_name = "_storeResume", ts_return_type = "Promise<number[]>")]
    pub fn _store_resume<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number[]")] handles: Arg<Vec<f64>>,
    ) -> Result<Object<'env>> {
        let ids = self.ids;
        self.spawn_keeping_logits(env, || {
            let handles =
                ids.from_js_all(&handles.get("resume: branches", "an array of Branch objects")?)?;
            Ok(move |e: &mut Engine| Ok(ids.to_js_all(&e.store.resume(&e.ctx, &handles)?)))
        })
    }

    /// Parked state beyond `ramBytes` spills into `dir` (both null: everything stays in RAM).
    #[napi(js_name = "_storeParkSpill")]
    pub fn _store_park_spill(&self, ram_bytes: Option<f64>, dir: Option<String>) -> Result<()> {
        let budget = match ram_bytes {
            Some(b) if !(b.is_finite() && b >= 0.0) => {
                return Err(js(crate::error::Error::invalid(
                    "setParkSpill: ramBytes must be a non-negative number of bytes",
                )))
            }
            b => b.map(|b| b as u64),
        };
        let fingerprint = fingerprint_of(&self.model, &self.info.kv);
        self.sync("setParkSpill", |e| {
            e.store.set_spill(budget, dir.map(Into::into), fingerprint)
        })
    }

    #[napi(js_name = "_storeParkStats")]
    pub fn _store_park_stats(&self) -> Result<ParkStatsInfo> {
        self.sync("parkStats", |e| {
            let s = e.store.park_stats();
            Ok(ParkStatsInfo {
                parked: s.parked,
                ram_bytes: s.ram_bytes as f64,
                disk_bytes: s.disk_bytes as f64,
                spilled: s.spilled,
                last_spill_error: s.last_spill_error,
            })
        })
    }

    /// The parked record of a branch, or null when it is not parked.
    #[napi(js_name = "_branchParked")]
    pub fn _branch_parked(&self, handle: f64) -> Result<Option<ParkedInfo>> {
        let h = self.ids.from_js(handle).map_err(js)?;
        self.sync("branch.parkedInfo", |e| {
            Ok(e.store.parked(h)?.map(|p| ParkedInfo {
                shared: p.shared,
                own: p.own,
                file: p.file().map(|f| f.to_string_lossy().into_owned()),
            }))
        })
    }
}
