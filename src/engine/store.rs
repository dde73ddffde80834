//! `BranchStore`: the branches of one context — their sequence leases, tree, KV accounting and
//! per-branch sampling state. Decoding lives in `step.rs`. Plain Rust over a `KvBackend`; the
//! caller holds the context lock.
//!
//! Consistency rules kept by every operation:
//! - a live branch's `position` equals its sequence's `pos_max + 1` (or 0 when empty);
//! - a vacant sequence id holds no KV cells;
//! - a failed operation changes no branch state, and any cells it wrote are removed again.

use super::branch::{BranchSampling, BranchState};
use super::handles::{Handle, HandleTable};
use super::kv::KvBackend;
use super::leases::LeasePool;
use super::plan::Limits;
use super::segments::{RunRef, Segments};
use crate::error::{Error, Result};
use crate::llama::{Batch, Pos, SeqId};

/// `{nCtx, cellsUsed, remaining}`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvPressure {
    pub n_ctx: u32,
    pub cells_used: u32,
    pub remaining: u32,
}

pub struct BranchStore {
    pub(super) branches: HandleTable<BranchState>,
    leases: LeasePool,
    /// Sequences of `destroy()`ed branches: their KV stays for raw use, so they are not vacant
    /// until they are empty again.
    detached: Vec<Detached>,
    pub(super) segments: Segments,
    pub(super) batch: Batch,
    pub(super) bias_scratch: Vec<f32>,
    /// Whether a step of two single-token branches decodes as two 1-row batches (measured per
    /// machine, see `calibrate`).
    pub(super) split_pairs: bool,
    /// Where parked branches' state goes beyond its RAM budget (engine/park.rs).
    pub(super) park_spill: super::park::Spill,
}

/// A destroyed branch's sequence. It keeps referencing the runs it shared with live branches,
/// so `kv_pressure` counts those cells once (counting the sequence whole could pass nCtx).
struct Detached {
    seq: SeqId,
    runs: Vec<RunRef>,
    /// Its extent when destroyed; cells beyond it come from raw decodes since.
    cells: u32,
}

/// Options for creating a root branch.
pub struct CreateOptions {
    pub position: Pos,
    pub seq: Option<SeqId>,
    pub sampling: BranchSampling,
    pub n_batch: Option<u32>,
}

/// Options for forking.
#[derive(Default)]
pub struct ForkOptions {
    /// A specific vacant sequence id (default: the store picks one).
    pub seq: Option<SeqId>,
    /// Share only the parent's cells below this position (default: the parent's position).
    pub position: Option<Pos>,
    /// Sampling state for the child (default: a copy of the parent's). A child at an earlier
    /// position should get a fresh one: the parent's grammar and penalty window describe tokens
    /// the child does not have.
    pub sampling: Option<BranchSampling>,
}

const TABLE_FULL: &str = "the branch table is full (65535 live branches)";

impl BranchStore {
    pub fn new(n_seq_max: u32, split_pairs: bool) -> Self {
        BranchStore {
            branches: HandleTable::default(),
            leases: LeasePool::new(n_seq_max),
            detached: Vec::new(),
            segments: Segments::default(),
            batch: Batch::default(),
            bias_scratch: Vec::new(),
            split_pairs,
            park_spill: Default::default(),
        }
    }

    pub fn get(&self, h: Handle) -> Result<&BranchState> {
        self.branches.get(h).ok_or(Error::BranchDisposed)
    }

    pub(super) fn get_mut(&mut self, h: Handle) -> Result<&mut BranchState> {
        self.branches.get_mut(h).ok_or(Error::BranchDisposed)
    }

    pub fn is_live(&self, h: Handle) -> bool {
        self.branches.contains(h)
    }

    pub fn live_handles(&self) -> Vec<Handle> {
        self.branches.handles()
    }

    pub fn len(&self) -> usize {
        self.branches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.branches.is_empty()
    }

    pub fn split_pairs(&self) -> bool {
        self.split_pairs
    }

    /// The decode limits of `kv` with this store's plan for pairs.
    pub fn limits(&self, kv: &impl KvBackend) -> Limits {
        super::decode::limits_of(kv, self.split_pairs)
    }

    /// The live branch leasing `seq`, if any.
    pub fn owner_of(&self, seq: SeqId) -> Option<Handle> {
        if !self.leases.is_leased(seq) {
            return None;
        }
        self.branches.handles().into_iter().find(|&h| {
            self.branches
                .get(h)
                .is_some_and(|b| b.seq == seq && !b.is_parked())
        })
    }

    /// A sequence a throwaway decode may use and clear within one operation (see
    /// `warmup::scratch_sequence`); leases nothing.
    pub fn scratch_sequence(&self, kv: &impl KvBackend) -> Option<SeqId> {
        super::warmup::scratch_sequence(&self.leases, kv)
    }

    /// Detached sequences whose cells were removed by raw KV calls become vacant again.
    fn reclaim_detached(&mut self, kv: &impl KvBackend) {
        let leases = &mut self.leases;
        let segments = &mut self.segments;
        self.detached.retain(|d| {
            if kv.seq_pos_max(d.seq) < 0 {
                leases.release(d.seq);
                segments.release_all(&d.runs);
                false
            } else {
                true
            }
        });
    }

    pub fn available(&mut self, kv: &impl KvBackend) -> u32 {
        self.reclaim_detached(kv);
        self.leases.available()
    }

    pub fn capacity(&self) -> u32 {
        self.leases.capacity()
    }

    pub(super) fn lease(&mut self, kv: &impl KvBackend, seq: Option<SeqId>) -> Result<SeqId> {
        self.reclaim_detached(kv);
        let n_seq_max = self.leases.capacity();
        match seq {
            None => self.leases.acquire().ok_or(Error::NoFreeSequence { n_seq_max }),
            Some(s) if s < 0 || s as u32 >= n_seq_max => Err(Error::invalid(format!("seqId {s} is out of range: this context has nSeqMax = {n_seq_max} (ids 0..{}); create the context with a larger nSeqMax", n_seq_max - 1))),
            Some(s) => self.leases.acquire_exact(s).ok_or_else(|| Error::invalid(format!("seqId {s} is already leased by another branch; omit it to let the store pick a free one"))),
        }
    }

    /// Gives back a lease whose sequence the caller has emptied (a failed restore, a scratch).
    pub(super) fn release_lease(&mut self, seq: SeqId) {
        self.leases.release(seq);
    }

    pub(super) fn insert(&mut self, state: BranchState) -> Result<Handle> {
        self.branches
            .insert(state)
            .ok_or_else(|| Error::invalid(TABLE_FULL))
    }

    /// A root branch on a sequence: it adopts whatever prefix the caller decoded into it and
    /// continues exactly where that prefix ends (llama.cpp rejects gaps).
    pub fn create(&mut self, kv: &impl KvBackend, opts: CreateOptions) -> Result<Handle> {
        let n_batch = validate_n_batch(opts.n_batch, kv.n_batch())?;
        if opts.position < 0 || opts.position as u32 > kv.n_ctx() {
            return Err(Error::invalid(format!(
                "position {} is outside [0, nCtx = {}]",
                opts.position,
                kv.n_ctx()
            )));
        }
        let seq = self.lease(kv, opts.seq)?;
        let pos_max = kv.seq_pos_max(seq);
        let expected = pos_max + 1;
        // A named empty sequence may get its prefix after the branch (see `adopt_copy`).
        let awaits_prefix = pos_max < 0 && opts.position > 0 && opts.seq.is_some();
        if opts.position != expected && !awaits_prefix {
            self.leases.release(seq);
            return Err(if pos_max < 0 {
                Error::invalid(format!(
                    "sequence {seq} (the lease this branch got) holds no tokens, so position must be 0, not {}; decode the prompt into sequence {seq} first (ctx.decode(tokens, 0, {seq}))",
                    opts.position
                ))
            } else {
                Error::invalid(format!("sequence {seq} holds positions up to {pos_max}, so the branch must start at position {expected}, not {}", opts.position))
            });
        }
        let mut runs = Vec::new();
        self.segments.append(&mut runs, kv.seq_extent(seq));
        let mut state = BranchState::new(
            seq,
            opts.position,
            n_batch,
            opts.sampling,
            kv.n_vocab() as usize,
            runs.clone(),
        );
        state.awaits_prefix = awaits_prefix;
        self.insert(state).inspect_err(|_| {
            self.segments.release_all(&runs);
            self.leases.release(seq);
        })
    }

    /// A root branch on a vacant sequence whose cells `load` writes (a stored sequence state,
    /// the prefix cache's RAM and disk tiers): the branch starts where they end. When `load`
    /// fails, or leaves a gap before its cells, nothing stays behind: the sequence is emptied
    /// and its lease given back.
    pub fn create_loaded(
        &mut self,
        kv: &impl KvBackend,
        sampling: BranchSampling,
        load: impl FnOnce(SeqId) -> Result<()>,
    ) -> Result<Handle> {
        let seq = self.lease(kv, None)?;
        kv.seq_rm(seq, -1, -1); // vacant ids are clean; raw KV calls may have written to them
        let undo = |store: &mut Self| {
            kv.seq_rm(seq, -1, -1);
            store.leases.release(seq);
        };
        if let Err(e) = load(seq) {
            undo(self);
            return Err(e);
        }
        let position = kv.seq_pos_max(seq) + 1;
        if position <= 0 {
            undo(self);
            return Err(Error::State(
                "the loaded state holds no cells; nothing to restore".into(),
            ));
        }
        // A stored state starts at position 0 (the cache's entries are roots or forks of them):
        // the full cache holds all `position` cells even where a sliding-window cache reports
        // a later lowest position.
        let mut runs = Vec::new();
        self.segments.append(&mut runs, position as u32);
        let n_batch = kv.n_batch();
        let state = BranchState::new(
            seq,
            position,
            n_batch,
            sampling,
            kv.n_vocab() as usize,
            runs.clone(),
        );
        self.insert(state).inspect_err(|_| {
            self.segments.release_all(&runs);
            undo(self);
        })
    }

    /// A child sharing the parent's KV prefix (metadata-only copy under unified KV), with its
    /// own copies of the parent's sampler chain, grammar state, logits and metrics (see
    /// `ForkOptions` for a child at an earlier position).
    pub fn fork(
        &mut self,
        kv: &impl KvBackend,
        parent: Handle,
        opts: ForkOptions,
    ) -> Result<Handle> {
        let p = self.get(parent)?;
        p.check_has_prefix()?;
        let position = opts.position.unwrap_or(p.position);
        // The parent's cells span [base, position): its runs count them exactly (llama.cpp's
        // lowest position of a sequence is the sliding-window cache's, not the full cache's).
        let base = p.position - p.held();
        if position > p.position || (position < base && position != 0) {
            return Err(Error::invalid(format!(
                "fork position {position} is outside the parent's cells [{base}, {}]",
                p.position
            )));
        }
        super::media::check_not_inside(&p.images, position)?;
        let n_swa = kv.n_swa();
        if position < p.position && n_swa > 0 && p.position as u32 >= n_swa {
            return Err(Error::Unsupported(format!(
                "forkAt({position}): this model attends over a sliding window of {n_swa} positions, and the parent at position {} has let its cells older than its window go (llama.cpp may already have reused them), which a child at {position} still needs; fork at the parent's own position, or keep a branch at {position} (e.g. fork it there before it moves past the window)",
                p.position
            )));
        }
        let sampling = match opts.sampling {
            Some(s) => s,
            None => p.sampling.try_clone()?,
        };
        let src_seq = p.seq;
        let shared_cells = (position - base).max(0) as u32;
        let seq = self.lease(kv, opts.seq)?;
        // Vacant ids are clean, but clearing first costs nothing and guards against raw KV calls.
        kv.seq_rm(seq, -1, -1);
        kv.seq_cp(src_seq, seq, -1, position);
        let p = self.get(parent)?;
        let runs = p.runs.clone();
        let runs = self.segments.share_prefix(&runs, shared_cells);
        let child = self
            .get(parent)?
            .fork(seq, position, sampling, runs.clone(), parent);
        match self.insert(child) {
            Ok(h) => {
                self.get_mut(parent)?.children.push(h);
                Ok(h)
            }
            Err(e) => {
                self.segments.release_all(&runs);
                kv.seq_rm(seq, -1, -1);
                self.leases.release(seq);
                Err(e)
            }
        }
    }

    /// Gives a branch created ahead of its prefix (`awaits_prefix`) its cells: `src`'s cells in
    /// `[p0, p1)` are tagged onto the branch's sequence, which must then end exactly where the
    /// branch was created. Anything else is undone and refused.
    pub fn adopt_copy(
        &mut self,
        kv: &impl KvBackend,
        h: Handle,
        src: SeqId,
        p0: Pos,
        p1: Pos,
    ) -> Result<()> {
        let b = self.get(h)?;
        let (seq, position) = (b.seq, b.position);
        if !b.awaits_prefix {
            return Err(Error::invalid(format!(
                "sequence {seq} is leased by a live branch; copying into it would desynchronise it. Use the branch API (fork/forkAt) or prune the branch first"
            )));
        }
        kv.seq_rm(seq, -1, -1);
        kv.seq_cp(src, seq, p0, p1);
        let end = kv.seq_pos_max(seq) + 1;
        if end != position {
            kv.seq_rm(seq, -1, -1);
            return Err(Error::invalid(format!(
                "the copy into sequence {seq} ends at position {end}, but its branch was created at position {position}; copy the prefix [0, {position}) of the source"
            )));
        }
        let cells = kv.seq_extent(seq);
        let shared = match self.owner_of(src) {
            Some(owner) => {
                let owner_runs = self.get(owner)?.runs.clone();
                self.segments.share_prefix(&owner_runs, cells)
            }
            None => {
                let mut runs = Vec::new();
                self.segments.append(&mut runs, cells);
                runs
            }
        };
        let b = self.get_mut(h)?;
        b.runs = shared;
        b.awaits_prefix = false;
        Ok(())
    }

    /// Unlinks `h` from the tree, handing its children to its parent.
    fn unlink(&mut self, h: Handle) {
        let Some(b) = self.branches.get(h) else {
            return;
        };
        let parent = b.parent;
        let children = b.children.clone();
        for &c in &children {
            if let Some(child) = self.branches.get_mut(c) {
                child.parent = parent;
            }
        }
        if let Some(p) = parent.and_then(|p| self.branches.get_mut(p)) {
            p.children.retain(|&c| c != h);
            p.children.extend(children);
        }
    }

    /// Frees the branch and its KV tags; its children live on, re-parented to its parent.
    pub fn prune(&mut self, kv: &impl KvBackend, h: Handle) -> Result<Vec<Handle>> {
        if self.check_parked_children(kv, h).is_err() {
            return self.keep_as_ghost(kv, h); // engine/park.rs: freed once nothing needs it
        }
        self.unlink(h);
        let b = self.branches.remove(h).ok_or(Error::BranchDisposed)?;
        if !b.is_parked() {
            self.segments.release_all(&b.runs);
            kv.seq_rm(b.seq, -1, -1);
            self.leases.release(b.seq);
        }
        self.free_ghosts(kv);
        Ok(vec![h])
    }

    /// Frees the branch and all its descendants (descendants first).
    pub fn prune_subtree(&mut self, kv: &impl KvBackend, h: Handle) -> Result<Vec<Handle>> {
        self.get(h)?;
        let mut order = Vec::new();
        let mut stack = vec![h];
        while let Some(x) = stack.pop() {
            order.push(x);
            if let Some(b) = self.branches.get(x) {
                stack.extend(b.children.iter().copied());
            }
        }
        for &x in order.iter().rev() {
            self.prune(kv, x)?;
        }
        Ok(order)
    }

    /// Frees the branch but leaves its sequence's KV in place for raw `ctx` calls. The sequence
    /// id stays reserved until its cells are removed (e.g. `kvCacheRemove(seq, 0, -1)`).
    pub fn destroy(&mut self, kv: &impl KvBackend, h: Handle) -> Result<SeqId> {
        self.get(h)?.check_not_parked()?;
        self.check_parked_children(kv, h)?;
        self.unlink(h);
        // The runs stay referenced by the detached sequence.
        let b = self.branches.remove(h).ok_or(Error::BranchDisposed)?;
        self.detached.push(Detached {
            seq: b.seq,
            runs: b.runs,
            cells: b.position.max(0) as u32,
        });
        Ok(b.seq)
    }

    /// Keeps only `winner` (one `seq_keep` pass); every other branch is freed.
    pub fn retain_only(&mut self, kv: &impl KvBackend, winner: Handle) -> Result<Vec<Handle>> {
        let w = self.get(winner)?;
        w.check_not_parked()?;
        let (seq, held) = (w.seq, w.held() as u32);
        kv.seq_keep(seq);
        let losers: Vec<Handle> = self
            .branches
            .handles()
            .into_iter()
            .filter(|&h| h != winner)
            .collect();
        for &h in &losers {
            self.branches.remove(h);
        }
        self.detached.clear();
        self.park_spill.forget_ghosts(); // every ghost was a loser
        self.leases.retain_only(seq);
        self.segments.clear();
        let mut runs = Vec::new();
        self.segments.append(&mut runs, held);
        let w = self.get_mut(winner)?;
        w.parent = None;
        w.children.clear();
        w.fork_head = 0;
        w.runs = runs;
        Ok(losers)
    }

    /// Frees every branch and its KV (context teardown or a full reset).
    pub fn clear(&mut self, kv: &impl KvBackend) -> Vec<Handle> {
        let all = self.branches.handles();
        for &h in &all {
            match self.branches.remove(h) {
                Some(b) if !b.is_parked() => kv.seq_rm(b.seq, -1, -1),
                _ => true,
            };
        }
        for d in self.detached.drain(..) {
            kv.seq_rm(d.seq, -1, -1);
        }
        self.park_spill.forget_ghosts();
        self.leases = LeasePool::new(self.leases.capacity());
        self.segments.clear();
        all
    }

    pub fn kv_pressure(&self, kv: &impl KvBackend) -> KvPressure {
        self.pressure_over(kv, self.segments.total())
    }

    /// KV usage as if the branches `without` were pruned (parked ones hold no cells; a handle
    /// named twice counts once): what a cache of idle prefixes would leave held by the rest.
    pub fn kv_pressure_without(
        &self,
        kv: &impl KvBackend,
        without: &[Handle],
    ) -> Result<KvPressure> {
        let (mut seen, mut runs) = (Vec::with_capacity(without.len()), Vec::new());
        for &h in without {
            let b = self.get(h)?;
            if !b.is_parked() && !seen.contains(&h) {
                seen.push(h);
                runs.push(b.runs.as_slice());
            }
        }
        Ok(self.pressure_over(kv, self.segments.total_without(&runs)))
    }

    fn pressure_over(&self, kv: &impl KvBackend, segment_cells: u64) -> KvPressure {
        let mut used = segment_cells;
        // Sequences no live branch owns (raw decodes) count as contiguous runs; destroyed
        // branches' sequences are in `segments` already, plus what raw decodes added to them.
        for seq in 0..self.leases.capacity() as SeqId {
            let detached = self.detached.iter().find(|d| d.seq == seq);
            if self.leases.is_leased(seq) && detached.is_none() {
                continue;
            }
            let extent = kv.seq_extent(seq) as u64;
            used += extent.saturating_sub(detached.map_or(0, |d| d.cells as u64));
        }
        let n_ctx = kv.n_ctx();
        let cells_used = used.min(u32::MAX as u64) as u32;
        KvPressure {
            n_ctx,
            cells_used,
            remaining: n_ctx.saturating_sub(cells_used),
        }
    }
}

fn validate_n_batch(n_batch: Option<u32>, ctx_n_batch: u32) -> Result<u32> {
    match n_batch {
        None => Ok(ctx_n_batch),
        Some(n) if n >= 1 && n <= ctx_n_batch => Ok(n),
        Some(n) => Err(Error::invalid(format!(
            "nBatch {n} must be in [1, {ctx_n_batch}] (the context's nBatch)"
        ))),
    }
}
