//! `BranchStore`: the branches of one context, their sequence leases, topology, KV accounting and
//! batched decoding. Plain Rust over the `ffi` layer; the caller holds the context lock.
//!
//! Consistency rules kept by every operation:
//! - a live branch's `position` equals its sequence's `pos_max + 1` (or 0 when empty);
//! - a vacant sequence id holds no KV cells;
//! - a failed decode changes no branch state, and any cells it wrote are removed again.

use crate::error::{Error, Result};
use crate::ffi::{Batch, Context, Pos, Sampler, Token, TokenData};
use crate::handles::{Handle, HandleTable};
use crate::leases::{LeasePool, SeqId};
use crate::metrics::{self, Base, Perplexity};
use crate::plan::{bin_pack, sub_batches, Chunk};
use crate::sampling::{self, Chain, SamplingConfig};

/// Refcounted runs of KV cells. A branch references the runs its sequence is tagged on; a fork
/// references its parent's runs (the cells are shared, not copied). `total` is therefore the
/// exact number of cells held by live branches, whatever order forks and prunes happen in.
#[derive(Default)]
struct Segments {
    len: Vec<u32>,
    refs: Vec<u32>,
    free: Vec<u32>,
    total: u64,
}

impl Segments {
    fn create(&mut self, len: u32) -> u32 {
        self.total += len as u64;
        if let Some(id) = self.free.pop() {
            self.len[id as usize] = len;
            self.refs[id as usize] = 1;
            id
        } else {
            self.len.push(len);
            self.refs.push(1);
            (self.len.len() - 1) as u32
        }
    }

    fn retain(&mut self, id: u32) {
        self.refs[id as usize] += 1;
    }

    fn release(&mut self, id: u32) {
        let refs = &mut self.refs[id as usize];
        *refs -= 1;
        if *refs == 0 {
            self.total -= self.len[id as usize] as u64;
            self.free.push(id);
        }
    }

    /// Adds `n` cells written by one branch: grows its own tail run or starts a new one.
    fn append(&mut self, runs: &mut Vec<u32>, n: u32) {
        if n == 0 {
            return;
        }
        match runs.last() {
            Some(&last) if self.refs[last as usize] == 1 => {
                self.len[last as usize] += n;
                self.total += n as u64;
            }
            _ => runs.push(self.create(n)),
        }
    }

    fn clear(&mut self) {
        *self = Segments::default();
    }
}

pub struct BranchState {
    pub seq: SeqId,
    pub position: Pos,
    pub fork_head: Pos,
    pub parent: Option<Handle>,
    pub children: Vec<Handle>,
    pub n_batch: u32,
    chain: Chain,
    grammar: Option<Sampler>,
    steer: Vec<(Token, f32)>,
    logits: Vec<f32>,
    /// Receives a new logits row during a decode; swapped in only when the whole call succeeds.
    pending_logits: Vec<f32>,
    has_logits: bool,
    candidates: Vec<TokenData>,
    last_sampled: Option<Token>,
    pub model_ppl: Perplexity,
    pub sampling_ppl: Perplexity,
    runs: Vec<u32>,
}

impl BranchState {
    pub fn has_logits(&self) -> bool {
        self.has_logits
    }

    pub fn logits(&self) -> Result<&[f32]> {
        if self.has_logits {
            Ok(&self.logits)
        } else {
            Err(Error::NoLogits)
        }
    }

    pub fn is_stochastic(&self) -> bool {
        self.chain.is_stochastic()
    }

    pub fn has_grammar(&self) -> bool {
        self.grammar.is_some()
    }

    pub fn config(&self) -> &SamplingConfig {
        self.chain.config()
    }
}

/// `{nCtx, cellsUsed, remaining}`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvPressure {
    pub n_ctx: u32,
    pub cells_used: u32,
    pub remaining: u32,
}

pub struct BranchStore {
    branches: HandleTable<BranchState>,
    leases: LeasePool,
    /// Sequences of `destroy()`ed branches: their KV stays for raw use, so they are not vacant
    /// until they are empty again.
    detached: Vec<Detached>,
    segments: Segments,
    batch: Batch,
    bias_scratch: Vec<f32>,
}

/// A destroyed branch's sequence. It keeps referencing the runs it shared with live branches,
/// so `kv_pressure` counts those cells once (counting the sequence whole could pass nCtx).
struct Detached {
    seq: SeqId,
    runs: Vec<u32>,
    /// Its extent when destroyed; cells beyond it come from raw decodes since.
    cells: u32,
}

/// Options for creating a root branch.
pub struct CreateOptions {
    pub position: Pos,
    pub seq: Option<SeqId>,
    pub config: SamplingConfig,
    pub n_batch: Option<u32>,
}

impl BranchStore {
    pub fn new(n_seq_max: u32) -> Self {
        BranchStore {
            branches: HandleTable::default(),
            leases: LeasePool::new(n_seq_max),
            detached: Vec::new(),
            segments: Segments::default(),
            batch: Batch::default(),
            bias_scratch: Vec::new(),
        }
    }

    pub fn get(&self, h: Handle) -> Result<&BranchState> {
        self.branches.get(h).ok_or(Error::BranchDisposed)
    }

    fn get_mut(&mut self, h: Handle) -> Result<&mut BranchState> {
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

    /// The live branch leasing `seq`, if any.
    pub fn owner_of(&self, seq: SeqId) -> Option<Handle> {
        if !self.leases.is_leased(seq) {
            return None;
        }
        self.branches
            .handles()
            .into_iter()
            .find(|&h| self.branches.get(h).is_some_and(|b| b.seq == seq))
    }

    pub fn is_seq_leased(&self, seq: SeqId) -> bool {
        self.leases.is_leased(seq)
    }

    /// Detached sequences whose cells were removed by raw KV calls become vacant again.
    fn reclaim_detached(&mut self, ctx: &Context) {
        let leases = &mut self.leases;
        let segments = &mut self.segments;
        self.detached.retain(|d| {
            if ctx.seq_pos_max(d.seq) < 0 {
                leases.release(d.seq);
                for &r in &d.runs {
                    segments.release(r);
                }
                false
            } else {
                true
            }
        });
    }

    pub fn available(&mut self, ctx: &Context) -> u32 {
        self.reclaim_detached(ctx);
        self.leases.available()
    }

    pub fn capacity(&self) -> u32 {
        self.leases.capacity()
    }

    fn lease(&mut self, ctx: &Context, seq: Option<SeqId>) -> Result<SeqId> {
        self.reclaim_detached(ctx);
        let n_seq_max = self.leases.capacity();
        match seq {
            None => self.leases.acquire().ok_or(Error::NoFreeSequence { n_seq_max }),
            Some(s) if s < 0 || s as u32 >= n_seq_max => Err(Error::invalid(format!("seqId {s} is out of range: this context has nSeqMax = {n_seq_max} (ids 0..{})", n_seq_max - 1))),
            Some(s) => self.leases.acquire_exact(s).ok_or_else(|| Error::invalid(format!("seqId {s} is already leased by another branch; omit it to let the store pick a free one"))),
        }
    }

    pub fn create(&mut self, ctx: &Context, opts: CreateOptions) -> Result<Handle> {
        let n_batch = validate_n_batch(opts.n_batch, ctx)?;
        if opts.position < 0 || opts.position as u32 > ctx.n_ctx() {
            return Err(Error::invalid(format!(
                "position {} is outside [0, nCtx = {}]",
                opts.position,
                ctx.n_ctx()
            )));
        }
        let chain = Chain::build(opts.config.clone(), &ctx.model, ctx.n_ctx())?;
        let grammar = match &opts.config.grammar {
            Some(g) => Some(crate::ffi::grammar_sampler(&ctx.model, g, "root", None)?),
            None => None,
        };
        let seq = self.lease(ctx, opts.seq)?;
        // The branch adopts whatever prefix the caller decoded into its sequence, and must
        // continue exactly where that prefix ends (llama.cpp rejects gaps).
        let pos_max = ctx.seq_pos_max(seq);
        let expected = pos_max + 1;
        if opts.position != expected {
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
        if pos_max >= 0 {
            let cells = (pos_max - ctx.seq_pos_min(seq).max(0) + 1).max(0) as u32;
            self.segments.append(&mut runs, cells);
        }
        let state = BranchState {
            seq,
            position: opts.position,
            fork_head: 0,
            parent: None,
            children: Vec::new(),
            n_batch,
            chain,
            grammar,
            steer: Vec::new(),
            logits: vec![0.0; ctx.n_vocab() as usize],
            pending_logits: Vec::new(),
            has_logits: false,
            candidates: Vec::new(),
            last_sampled: None,
            model_ppl: Perplexity::default(),
            sampling_ppl: Perplexity::default(),
            runs,
        };
        match self.branches.insert(state) {
            Some(h) => Ok(h),
            None => {
                self.leases.release(seq);
                Err(Error::invalid(
                    "the branch table is full (65535 live branches)",
                ))
            }
        }
    }

    /// Child shares the parent's KV prefix (metadata-only copy under unified KV) and gets
    /// independent copies of its sampler chain, grammar state, logits and metrics.
    pub fn fork(&mut self, ctx: &Context, parent: Handle, seq: Option<SeqId>) -> Result<Handle> {
        let p = self.get(parent)?;
        let chain = p.chain.try_clone()?;
        let grammar = p.grammar.as_ref().map(|g| g.try_clone()).transpose()?;
        let (src_seq, position, n_batch) = (p.seq, p.position, p.n_batch);
        let (logits, has_logits, model_ppl, sampling_ppl) =
            (p.logits.clone(), p.has_logits, p.model_ppl, p.sampling_ppl);
        let runs = p.runs.clone();
        let p_runs = runs.clone();
        let new_seq = self.lease(ctx, seq)?;
        // Vacant ids are clean, but clearing first costs nothing and guards against raw KV calls.
        ctx.seq_rm(new_seq, -1, -1);
        ctx.seq_cp(src_seq, new_seq, -1, -1);
        for &r in &runs {
            self.segments.retain(r);
        }
        let child = BranchState {
            seq: new_seq,
            position,
            fork_head: position,
            parent: Some(parent),
            children: Vec::new(),
            n_batch,
            chain,
            grammar,
            steer: Vec::new(),
            logits,
            pending_logits: Vec::new(),
            has_logits,
            candidates: Vec::new(),
            last_sampled: None,
            model_ppl,
            sampling_ppl,
            runs,
        };
        let Some(h) = self.branches.insert(child) else {
            for &r in &p_runs {
                self.segments.release(r);
            }
            ctx.seq_rm(new_seq, -1, -1);
            self.leases.release(new_seq);
            return Err(Error::invalid(
                "the branch table is full (65535 live branches)",
            ));
        };
        self.get_mut(parent)?.children.push(h);
        Ok(h)
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

    fn remove(&mut self, h: Handle) -> Option<BranchState> {
        self.unlink(h);
        let b = self.branches.remove(h)?;
        for &r in &b.runs {
            self.segments.release(r);
        }
        Some(b)
    }

    /// Frees the branch and its KV tags; its children live on, re-parented to its parent.
    pub fn prune(&mut self, ctx: &Context, h: Handle) -> Result<Vec<Handle>> {
        let b = self.remove(h).ok_or(Error::BranchDisposed)?;
        ctx.seq_rm(b.seq, -1, -1);
        self.leases.release(b.seq);
        Ok(vec![h])
    }

    /// Frees the branch and all its descendants (descendants first).
    pub fn prune_subtree(&mut self, ctx: &Context, h: Handle) -> Result<Vec<Handle>> {
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
            self.prune(ctx, x)?;
        }
        Ok(order)
    }

    /// Frees the branch but leaves its sequence's KV in place for raw `ctx` calls. The sequence
    /// id stays reserved until its cells are removed (e.g. `kvCacheRemove(seq, 0, -1)`).
    pub fn destroy(&mut self, h: Handle) -> Result<(Vec<Handle>, SeqId)> {
        self.get(h)?;
        self.unlink(h);
        // Not `remove`: the runs stay referenced by the detached sequence.
        let b = self.branches.remove(h).ok_or(Error::BranchDisposed)?;
        self.detached.push(Detached {
            seq: b.seq,
            runs: b.runs,
            cells: b.position.max(0) as u32,
        });
        Ok((vec![h], b.seq))
    }

    /// Keeps only `winner` (one `seq_keep` pass); every other branch is freed.
    pub fn retain_only(&mut self, ctx: &Context, winner: Handle) -> Result<Vec<Handle>> {
        let seq = self.get(winner)?.seq;
        ctx.seq_keep(seq);
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
        self.leases.retain_only(seq);
        self.segments.clear();
        let cells = (ctx.seq_pos_max(seq) - ctx.seq_pos_min(seq).max(0) + 1).max(0) as u32;
        let mut runs = Vec::new();
        self.segments.append(&mut runs, cells);
        let w = self.get_mut(winner)?;
        w.parent = None;
        w.children.clear();
        w.fork_head = 0;
        w.runs = runs;
        Ok(losers)
    }

    /// Frees every branch and its KV (context teardown or a full reset).
    pub fn clear(&mut self, ctx: &Context) -> Vec<Handle> {
        let all = self.branches.handles();
        for &h in &all {
            if let Some(b) = self.branches.remove(h) {
                ctx.seq_rm(b.seq, -1, -1);
            }
        }
        for d in self.detached.drain(..) {
            ctx.seq_rm(d.seq, -1, -1);
        }
        self.leases = LeasePool::new(self.leases.capacity());
        self.segments.clear();
        all
    }

    pub fn kv_pressure(&self, ctx: &Context) -> KvPressure {
        let mut used = self.segments.total;
        // Sequences no live branch owns (raw decodes) count as contiguous runs; destroyed
        // branches' sequences are in `segments` already, plus what raw decodes added to them.
        for seq in 0..self.leases.capacity() as SeqId {
            let detached = self.detached.iter().find(|d| d.seq == seq);
            if self.leases.is_leased(seq) && detached.is_none() {
                continue;
            }
            let max = ctx.seq_pos_max(seq);
            if max >= 0 {
                let extent = (max - ctx.seq_pos_min(seq).max(0) + 1) as u64;
                used += extent.saturating_sub(detached.map_or(0, |d| d.cells as u64));
            }
        }
        let n_ctx = ctx.n_ctx();
        let cells_used = used.min(u32::MAX as u64) as u32;
        KvPressure {
            n_ctx,
            cells_used,
            remaining: n_ctx.saturating_sub(cells_used),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Decoding

    fn check_distinct(handles: &[Handle]) -> Result<()> {
        let mut seen = handles.to_vec();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!(
                "branch {} appears more than once in one call; give each branch one entry",
                w[0]
            )));
        }
        Ok(())
    }

    fn check_room(&self, ctx: &Context, h: Handle, n: usize) -> Result<()> {
        let b = self.get(h)?;
        let end = b.position as u64 + n as u64;
        if end > ctx.n_ctx() as u64 {
            return Err(Error::KvFull(format!(
                "branch {h} is at position {} and {n} more tokens would pass nCtx = {}",
                b.position,
                ctx.n_ctx()
            )));
        }
        Ok(())
    }

    /// Removes whatever a failed decode may have written past each branch's position.
    fn roll_back_kv(&self, ctx: &Context, handles: &[Handle]) {
        for &h in handles {
            if let Some(b) = self.branches.get(h) {
                ctx.seq_rm(b.seq, b.position, -1);
            }
        }
    }

    /// One token per branch. With `accept`, each token is first accepted into its branch's sampler,
    /// grammar and metrics (against the logits it was sampled from); the decode happens before any
    /// of that is applied, so a failed decode leaves every branch exactly as it was.
    pub fn commit(
        &mut self,
        ctx: &mut Context,
        items: &[(Handle, Token)],
        accept: bool,
        cancel: &dyn Fn() -> bool,
    ) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let mut profile = crate::profile::Phases::start("commit", items.len());
        let handles: Vec<Handle> = items.iter().map(|i| i.0).collect();
        Self::check_distinct(&handles)?;
        if items.len() > ctx.n_batch() as usize {
            return Err(Error::invalid(format!(
                "{} branches in one commit exceed nBatch = {}; split the call",
                items.len(),
                ctx.n_batch()
            )));
        }
        for &(h, token) in items {
            self.check_room(ctx, h, 1)?;
            ctx.model.check_token(token as i64)?;
            if accept {
                let b = self.get_mut(h)?;
                let logit = if b.has_logits {
                    b.logits[token as usize]
                } else {
                    0.0
                };
                if let Some(g) = b.grammar.as_mut() {
                    if !sampling::grammar_allows(g, token, logit) {
                        return Err(Error::GrammarRejected(token));
                    }
                }
            }
        }
        // Model surprisal of each accepted token under the logits it was sampled from, computed
        // below alongside the logits copies (both are full-vocabulary passes).
        let mut surprisals = vec![f64::INFINITY; items.len()];
        let threads = ctx.n_threads();
        if let Some(p) = profile.as_mut() {
            p.mark("validate");
        }
        // A 2-row batch is slower than two 1-row decodes on CPU (measured), so split that case.
        let group = if items.len() == 2 { 1 } else { items.len() };
        for (c, chunk) in items.chunks(group).enumerate() {
            if cancel() {
                self.roll_back_kv(ctx, &handles);
                return Err(Error::Aborted);
            }
            self.batch.clear();
            for &(h, token) in chunk {
                let (position, seq) = {
                    let b = self.get(h)?;
                    (b.position, b.seq)
                };
                self.batch.push(token, position, seq, true);
            }
            if let Err(e) = ctx.decode(&mut self.batch) {
                self.roll_back_kv(ctx, &handles);
                return Err(e);
            }
            if let Some(p) = profile.as_mut() {
                p.mark("llama_decode");
            }
            let rows: Result<Vec<&[f32]>> = (0..chunk.len())
                .map(|row| ctx.logits_at(row as i32))
                .collect();
            let rows = match rows {
                Ok(rows) => rows,
                Err(e) => {
                    self.roll_back_kv(ctx, &handles);
                    return Err(e);
                }
            };
            let chunk_handles = &handles[c * group..c * group + chunk.len()];
            let branches = self
                .branches
                .get_many_mut(chunk_handles)
                .ok_or(Error::BranchDisposed)?;
            let out = &mut surprisals[c * group..c * group + chunk.len()];
            let mut work: Vec<_> = branches.into_iter().zip(rows).zip(chunk).zip(out).collect();
            crate::parallel::for_each(&mut work, threads, 2, |(((b, row), &(_, token)), out)| {
                if accept && b.has_logits {
                    **out = metrics::surprisal(&b.logits, token as usize, Base::Nats);
                }
                b.pending_logits.clear();
                b.pending_logits.extend_from_slice(row);
            });
            if let Some(p) = profile.as_mut() {
                p.mark("copy rows + surprisal");
            }
        }
        for (&(h, token), &surprisal) in items.iter().zip(&surprisals) {
            if accept {
                self.accept_with_surprisal(h, token, surprisal)?;
            }
            let b = self.branches.get_mut(h).ok_or(Error::BranchDisposed)?;
            std::mem::swap(&mut b.logits, &mut b.pending_logits);
            b.has_logits = true;
            b.position += 1;
            let mut runs = std::mem::take(&mut b.runs);
            self.segments.append(&mut runs, 1);
            self.get_mut(h)?.runs = runs;
        }
        if let Some(p) = profile.as_mut() {
            p.mark("accept + bookkeeping");
        }
        Ok(())
    }

    /// Variable-length runs (no accept: for tokens the model did not sample), bin-packed into
    /// decodes of at most `limit` tokens. All-or-nothing: on failure every branch is unchanged.
    pub fn prefill(
        &mut self,
        ctx: &mut Context,
        items: &[(Handle, Vec<Token>)],
        limit: Option<u32>,
        cancel: &dyn Fn() -> bool,
    ) -> Result<()> {
        let handles: Vec<Handle> = items.iter().map(|i| i.0).collect();
        Self::check_distinct(&handles)?;
        for (h, tokens) in items {
            self.check_room(ctx, *h, tokens.len())?;
            for &t in tokens {
                ctx.model.check_token(t as i64)?;
            }
        }
        let n_batch = limit.unwrap_or(u32::MAX).min(ctx.n_batch()).max(1) as usize;
        let lengths: Vec<usize> = items.iter().map(|(_, t)| t.len()).collect();
        let result = self.run_chunks(ctx, items, &bin_pack(&lengths, n_batch), n_batch, cancel);
        if let Err(e) = result {
            self.roll_back_kv(ctx, &handles);
            return Err(e);
        }
        for (h, tokens) in items.iter().filter(|(_, t)| !t.is_empty()) {
            let b = self.branches.get_mut(*h).ok_or(Error::BranchDisposed)?;
            std::mem::swap(&mut b.logits, &mut b.pending_logits);
            b.has_logits = true;
            b.position += tokens.len() as Pos;
            let mut runs = std::mem::take(&mut b.runs);
            self.segments.append(&mut runs, tokens.len() as u32);
            self.get_mut(*h)?.runs = runs;
        }
        Ok(())
    }

    fn run_chunks(
        &mut self,
        ctx: &mut Context,
        items: &[(Handle, Vec<Token>)],
        chunks: &[Chunk],
        n_batch: usize,
        cancel: &dyn Fn() -> bool,
    ) -> Result<()> {
        for chunk in chunks {
            match chunk {
                Chunk::Packed(members) => {
                    if cancel() {
                        return Err(Error::Aborted);
                    }
                    self.batch.clear();
                    let mut last_rows = Vec::with_capacity(members.len());
                    for &i in members {
                        let (h, tokens) = &items[i];
                        let (position, seq) = {
                            let b = self.get(*h)?;
                            (b.position, b.seq)
                        };
                        for (j, &t) in tokens.iter().enumerate() {
                            self.batch
                                .push(t, position + j as Pos, seq, j + 1 == tokens.len());
                        }
                        last_rows.push((*h, self.batch.len() - 1));
                    }
                    ctx.decode(&mut self.batch)?;
                    for (h, row) in last_rows {
                        let logits = ctx.logits_at(row as i32)?;
                        let b = self.branches.get_mut(h).ok_or(Error::BranchDisposed)?;
                        b.pending_logits.clear();
                        b.pending_logits.extend_from_slice(logits);
                    }
                }
                Chunk::Oversized(i) => {
                    let (h, tokens) = &items[*i];
                    let (seq, start) = {
                        let b = self.get(*h)?;
                        (b.seq, b.position)
                    };
                    for (offset, count) in sub_batches(tokens.len(), n_batch) {
                        if cancel() {
                            return Err(Error::Aborted);
                        }
                        self.batch.clear();
                        for j in offset..offset + count {
                            self.batch.push(
                                tokens[j],
                                start + j as Pos,
                                seq,
                                j + 1 == tokens.len(),
                            );
                        }
                        ctx.decode(&mut self.batch)?;
                    }
                    let logits = ctx.logits_at(-1)?;
                    let b = self.branches.get_mut(*h).ok_or(Error::BranchDisposed)?;
                    b.pending_logits.clear();
                    b.pending_logits.extend_from_slice(logits);
                }
            }
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // Sampling and per-branch state

    /// Samples from the branch's snapshot (no KV write, no accept). `Ok(None)`: every token is masked.
    pub fn sample(&mut self, h: Handle) -> Result<Option<Token>> {
        let b = self.branches.get_mut(h).ok_or(Error::BranchDisposed)?;
        sample_branch(b, &mut self.bias_scratch)
    }

    /// `sample` for several branches, spread over `threads` threads (each branch has its own
    /// sampler state, so the order does not matter). One result per handle, in order.
    pub fn sample_many(
        &mut self,
        handles: &[Handle],
        threads: usize,
    ) -> Vec<Result<Option<Token>>> {
        let _profile = crate::profile::Phases::start("produce", handles.len());
        let Some(branches) = self.branches.get_many_mut(handles) else {
            // A stale or repeated handle: sample one by one, each gets its own result.
            return handles.iter().map(|&h| self.sample(h)).collect();
        };
        let mut work: Vec<_> = branches.into_iter().map(|b| (b, Ok(None))).collect();
        crate::parallel::for_each(&mut work, threads, 4, |(b, result)| {
            *result = sample_branch(b, &mut Vec::new());
        });
        work.into_iter().map(|(_, r)| r).collect()
    }

    /// Advances the grammar and the penalty window, and records both perplexities.
    pub fn accept(&mut self, h: Handle, token: Token) -> Result<()> {
        let b = self.get(h)?;
        let surprisal = if b.has_logits && token >= 0 && (token as usize) < b.logits.len() {
            metrics::surprisal(&b.logits, token as usize, Base::Nats)
        } else {
            f64::INFINITY
        };
        self.accept_with_surprisal(h, token, surprisal)
    }

    /// `accept` with the model surprisal of `token` already computed from the branch's logits
    /// (infinite when it has none: not counted).
    fn accept_with_surprisal(
        &mut self,
        h: Handle,
        token: Token,
        model_surprisal: f64,
    ) -> Result<()> {
        let b = self.branches.get_mut(h).ok_or(Error::BranchDisposed)?;
        if token < 0 || token as usize >= b.logits.len() {
            return Err(Error::TokenOutOfRange {
                token: token as i64,
                n_vocab: b.logits.len() as i32,
            });
        }
        if let Some(g) = b.grammar.as_mut() {
            let logit = if b.has_logits {
                b.logits[token as usize]
            } else {
                0.0
            };
            if !sampling::grammar_allows(g, token, logit) {
                return Err(Error::GrammarRejected(token));
            }
            g.accept(token)?;
        }
        b.chain.accept(token)?;
        b.model_ppl.add(model_surprisal);
        if b.last_sampled == Some(token) && !b.candidates.is_empty() {
            let logits: Vec<f32> = b.candidates.iter().map(|c| c.logit).collect();
            if let Some(i) = b.candidates.iter().position(|c| c.id == token) {
                b.sampling_ppl
                    .add(metrics::surprisal(&logits, i, Base::Nats));
            }
        }
        b.last_sampled = None;
        Ok(())
    }

    /// Copies the context's last logits row into the branch (right after a raw decode for it).
    pub fn capture_logits(&mut self, ctx: &Context, h: Handle) -> Result<()> {
        let logits = ctx.logits_at(-1)?;
        let b = self.get_mut(h)?;
        b.logits.copy_from_slice(logits);
        b.has_logits = true;
        Ok(())
    }

    pub fn set_steer(&mut self, h: Handle, biases: Vec<(Token, f32)>) -> Result<()> {
        self.get_mut(h)?.steer = biases;
        Ok(())
    }

    pub fn reseed(&mut self, h: Handle, seed: u32, n_vocab: i32) -> Result<()> {
        self.get_mut(h)?.chain.reseed(seed, n_vocab)
    }

    /// Replaces the sampler chain (the penalty window and RNG start fresh).
    pub fn set_sampling(&mut self, ctx: &Context, h: Handle, config: SamplingConfig) -> Result<()> {
        let grammar_text = config.grammar.clone();
        let chain = Chain::build(config, &ctx.model, ctx.n_ctx())?;
        let grammar = grammar_text
            .map(|g| crate::ffi::grammar_sampler(&ctx.model, &g, "root", None))
            .transpose()?;
        let b = self.get_mut(h)?;
        b.chain = chain;
        if grammar.is_some() {
            b.grammar = grammar;
        }
        Ok(())
    }

    /// Installs (or with `None`, removes) a grammar; lazy grammars wait for a trigger.
    pub fn set_grammar(&mut self, h: Handle, grammar: Option<Sampler>) -> Result<()> {
        self.get_mut(h)?.grammar = grammar;
        Ok(())
    }
}

/// Samples from the branch's snapshot; `scratch` receives the biased copy when there are biases.
fn sample_branch(b: &mut BranchState, scratch: &mut Vec<f32>) -> Result<Option<Token>> {
    if !b.has_logits {
        return Err(Error::NoLogits);
    }
    let static_bias = b.chain.config().logit_bias.as_slice();
    let logits = sampling::biased(&b.logits, &[static_bias, &b.steer], scratch);
    let sampled = sampling::sample(&mut b.chain, b.grammar.as_mut(), logits, &mut b.candidates)?;
    b.last_sampled = sampled.as_ref().map(|s| s.token);
    Ok(b.last_sampled)
}

fn validate_n_batch(n_batch: Option<u32>, ctx: &Context) -> Result<u32> {
    let ctx_n_batch = ctx.n_batch();
    match n_batch {
        None => Ok(ctx_n_batch),
        Some(n) if n >= 1 && n <= ctx_n_batch => Ok(n),
        Some(n) => Err(Error::invalid(format!(
            "nBatch {n} must be in [1, {ctx_n_batch}] (the context's nBatch)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_count_shared_cells_once() {
        let mut s = Segments::default();
        let mut parent = Vec::new();
        s.append(&mut parent, 10);
        assert_eq!(s.total, 10);
        // fork: child references the same run
        let mut child = parent.clone();
        for &r in &child {
            s.retain(r);
        }
        assert_eq!(s.total, 10);
        s.append(&mut parent, 3);
        s.append(&mut child, 2);
        assert_eq!(s.total, 15);
        s.append(&mut child, 1);
        assert_eq!(s.total, 16, "child's own tail grows in place");
        assert_eq!(child.len(), 2);
        // prune the parent first: the shared prefix stays with the child
        for &r in &parent {
            s.release(r);
        }
        assert_eq!(s.total, 13);
        for &r in &child {
            s.release(r);
        }
        assert_eq!(s.total, 0);
    }

    #[test]
    fn segment_ids_are_recycled() {
        let mut s = Segments::default();
        let a = s.create(4);
        s.release(a);
        let b = s.create(7);
        assert_eq!(a, b);
        assert_eq!(s.total, 7);
    }
}
