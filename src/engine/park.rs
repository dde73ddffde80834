//! Parking (issue 62): a branch gives back its sequence id and its own KV cells — those beyond the
//! prefix it shares with its parent — and keeps what it needs to go on: those cells' state (as
//! llama.cpp's sequence state), and in its `BranchState` its logits snapshot, sampler chain,
//! grammar and perplexities, untouched. `resume` leases a free sequence, loads the own cells,
//! tags the parent's prefix back on (`seq_cp`, nothing re-decoded) and the branch continues
//! exactly where it was. A parked branch costs no lease and no cell, so a search may hold more
//! nodes than `nSeqMax`.
//!
//! Parked state stays in host memory up to a budget; beyond it the oldest parked branches spill
//! their cells and snapshot to a folder, one container file each (saved_state: checksum,
//! fingerprint, atomic write), removed when the branch resumes or is freed. The sampler and the
//! grammar stay in memory: llama.cpp cannot serialise them, and they are small.

use std::path::PathBuf;

use super::fingerprint::Fingerprint;
use super::handles::Handle;
use super::kv::KvBackend;
use super::saved_state::{container_bytes, parse_container, read_file, write_atomically, Payload};
use super::store::BranchStore;
use crate::error::{Error, Result};
use crate::llama::{Pos, SeqId};

/// What a parked branch keeps instead of its sequence.
pub struct Parked {
    /// Cells it shared with its parent when parked: the parent's prefix, tagged back on resume.
    pub shared: u32,
    /// Its own cells beyond `shared`.
    pub own: u32,
    cells: Cells,
    /// The order of parking: the oldest spill first.
    serial: u64,
}

enum Cells {
    /// The own cells' sequence state.
    Ram(Vec<u8>),
    /// Spilled: the cells' state, the snapshot and its normalizer in a container file.
    Disk { path: PathBuf, bytes: u64 },
}

impl Drop for Parked {
    fn drop(&mut self) {
        if let Cells::Disk { path, .. } = &self.cells {
            let _ = std::fs::remove_file(path); // freed with the branch; a missing file is fine
        }
    }
}

impl Parked {
    /// The spill file, while spilled.
    pub fn file(&self) -> Option<&std::path::Path> {
        match &self.cells {
            Cells::Disk { path, .. } => Some(path),
            Cells::Ram(_) => None,
        }
    }
}

/// A spilled snapshot: the logits row and its cached normalizer (`BranchState::take_logits`).
type Snapshot = (Vec<f32>, Option<f64>);

/// Where parked state goes beyond the RAM budget (`set_spill`).
#[derive(Default)]
pub struct Spill {
    ram_budget: Option<u64>,
    dir: Option<PathBuf>,
    fingerprint: Option<Fingerprint>,
    serial: u64,
    /// The last spill that failed (the branch stayed in RAM), for `park_stats`.
    last_error: Option<String>,
    /// Pruned branches kept parked for their parked children (see `keep_as_ghost`).
    ghosts: Vec<Handle>,
}

impl Spill {
    /// After a retainOnly or clear removed every branch but one live winner: no ghost is left.
    pub(super) fn forget_ghosts(&mut self) {
        self.ghosts.clear();
    }
}

/// `store.parkStats()`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParkStats {
    pub parked: u32,
    pub ram_bytes: u64,
    pub disk_bytes: u64,
    pub spilled: u32,
    pub last_spill_error: Option<String>,
}

fn not_parked() -> Error {
    Error::invalid("resume: the branch is not parked")
}

impl BranchStore {
    /// Parked state beyond `ram_budget` bytes spills into `dir` (None: everything stays in RAM).
    pub fn set_spill(
        &mut self,
        ram_budget: Option<u64>,
        dir: Option<PathBuf>,
        fp: Fingerprint,
    ) -> Result<()> {
        if let Some(dir) = &dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::invalid(format!("park spill folder {}: {e}", dir.display())))?;
        }
        if ram_budget.is_some() && dir.is_none() {
            return Err(Error::invalid(
                "a park RAM budget needs a spill folder (dir) for what goes beyond it",
            ));
        }
        let spill = &mut self.park_spill;
        (spill.ram_budget, spill.dir, spill.fingerprint) = (ram_budget, dir, Some(fp));
        self.spill_over_budget();
        Ok(())
    }

    /// Parks each branch (children before parents, so each keeps only its own cells); all or
    /// nothing: on a failure the ones parked here are resumed again.
    pub fn park(&mut self, kv: &impl KvBackend, handles: &[Handle]) -> Result<()> {
        let mut order: Vec<Handle> = Vec::with_capacity(handles.len());
        for &h in handles {
            let b = self.get(h)?;
            b.check_has_prefix()?;
            b.check_cells_end(kv, "such a branch cannot be parked; prune it")?;
            // Once each: a second park of the same branch would overwrite its record.
            if !order.contains(&h) {
                order.push(h);
            }
        }
        order.sort_by_key(|&h| std::cmp::Reverse(self.depth(h)));
        for (i, &h) in order.iter().enumerate() {
            if let Err(e) = self.park_one(kv, h) {
                let _ = self.resume(kv, &order[..i]);
                return Err(e);
            }
        }
        self.spill_over_budget();
        Ok(())
    }

    fn park_one(&mut self, kv: &impl KvBackend, h: Handle) -> Result<()> {
        let b = self.get(h)?;
        let parent = b
            .parent
            .and_then(|p| self.get(p).ok())
            .filter(|p| !p.is_parked());
        let mut shared = parent.map_or(0, |p| self.shareable(kv, p, b));
        let (seq, cells, parent_seq) = (b.seq, b.held() as u32, parent.map(|p| p.seq));
        // The own cells alone: the prefix's tags come off this sequence only (the parent keeps
        // its own). A memory that refuses a partial removal (recurrent) saves the whole sequence.
        if shared > 0 && !kv.seq_rm(seq, 0, shared as Pos) {
            shared = 0;
        }
        let state = if cells > shared {
            kv.seq_state(seq)
        } else {
            Ok(Vec::new())
        };
        let state = match state {
            Ok(s) => s,
            Err(e) => {
                if let (Some(p), true) = (parent_seq, shared > 0) {
                    kv.seq_cp(p, seq, -1, shared as Pos); // the prefix back: nothing changed
                }
                return Err(e);
            }
        };
        kv.seq_rm(seq, -1, -1);
        self.release_lease(seq);
        let serial = self.park_spill.serial;
        self.park_spill.serial += 1;
        let b = self.get_mut(h)?;
        let runs = std::mem::take(&mut b.runs);
        b.free_scratch();
        b.parked = Some(Parked {
            shared,
            own: cells - shared,
            cells: Cells::Ram(state),
            serial,
        });
        self.segments.release_all(&runs);
        Ok(())
    }

    /// Resumes each branch, and first every parked ancestor whose cells it needs; all or
    /// nothing (sequences and cells are checked first; a failure re-parks what it resumed).
    /// Resolves every branch resumed, parents first.
    pub fn resume(&mut self, kv: &impl KvBackend, handles: &[Handle]) -> Result<Vec<Handle>> {
        let order = self.resume_order(handles)?;
        let needed = order.len() as u32;
        let free = self.available(kv);
        if free < needed {
            let n_seq_max = self.capacity();
            return Err(Error::NotEnoughSequences {
                what: "resume",
                needed,
                free,
                n_seq_max,
            });
        }
        let cells: u64 = order
            .iter()
            .map(|&h| self.parked_of(h).map_or(0, |p| p.own as u64))
            .sum();
        let remaining = self.kv_pressure(kv).remaining as u64;
        if cells > remaining {
            return Err(Error::KvFull(format!("resume needs {cells} cells for the parked branches' own tokens, {remaining} are free")));
        }
        let mut done: Vec<(Handle, Parked)> = Vec::with_capacity(order.len());
        for &h in &order {
            match self.resume_one(kv, h) {
                Ok(parked) => done.push((h, parked)),
                Err(e) => {
                    for (h, parked) in done.into_iter().rev() {
                        self.repark(kv, h, parked);
                    }
                    return Err(e);
                }
            }
        }
        drop(done); // spill files go with the records
        self.free_ghosts(kv);
        Ok(order
            .into_iter()
            .filter(|&h| !self.is_ghost(h) && self.is_live(h))
            .collect())
    }

    /// The branches to resume for `handles`: each, and its parked ancestors whose cells it
    /// needs, parents first.
    fn resume_order(&self, handles: &[Handle]) -> Result<Vec<Handle>> {
        let mut order = Vec::new();
        for &h in handles {
            let mut x = h;
            loop {
                let b = self.get(x)?;
                let Some(p) = &b.parked else {
                    if x == h {
                        return Err(not_parked());
                    }
                    break;
                };
                if !order.contains(&x) {
                    order.push(x);
                }
                match (b.parent, p.shared > 0) {
                    (Some(parent), true) if self.get(parent)?.is_parked() => x = parent,
                    (None, true) => {
                        return Err(Error::State(
                            "a parked branch shares cells with a parent that is gone".into(),
                        ))
                    }
                    _ => break,
                }
            }
        }
        order.sort_by_key(|&h| self.depth(h));
        Ok(order)
    }

    fn resume_one(&mut self, kv: &impl KvBackend, h: Handle) -> Result<Parked> {
        let b = self.get_mut(h)?;
        let mut parked = b.parked.take().ok_or_else(not_parked)?;
        let (position, parent) = (b.position, b.parent);
        let loaded = match &mut parked.cells {
            Cells::Ram(state) => Ok((std::mem::take(state), None)),
            Cells::Disk { path, .. } => self.read_spill(path),
        };
        let placed = loaded.and_then(|(mut state, logits)| {
            let seq = self.lease(kv, None)?;
            let result = self.place(kv, seq, &mut state, &parked, parent, position);
            if let Cells::Ram(kept) = &mut parked.cells {
                *kept = state; // back in place for a re-park; dropped with `parked` otherwise
            }
            match result {
                Ok(runs) => Ok((seq, runs, logits)),
                Err(e) => {
                    kv.seq_rm(seq, -1, -1);
                    self.release_lease(seq);
                    Err(e)
                }
            }
        });
        let b = self.get_mut(h)?;
        match placed {
            Ok((seq, runs, logits)) => {
                (b.seq, b.runs) = (seq, runs);
                if let Some((row, log_z)) = logits {
                    b.put_logits(row, log_z);
                }
                Ok(parked)
            }
            Err(e) => {
                b.parked = Some(parked);
                Err(e)
            }
        }
    }

    /// Loads the own cells into `seq` and tags the parent's prefix on; the runs it then holds.
    fn place(
        &mut self,
        kv: &impl KvBackend,
        seq: SeqId,
        state: &mut [u8],
        parked: &Parked,
        parent: Option<Handle>,
        position: Pos,
    ) -> Result<Vec<super::segments::RunRef>> {
        kv.seq_rm(seq, -1, -1);
        if !state.is_empty() {
            state[4..8].copy_from_slice(&seq.to_le_bytes());
            if kv.set_seq_state(seq, state) != state.len() {
                return Err(Error::State(
                    "llama.cpp refused the parked branch's cells; it stays parked".into(),
                ));
            }
        }
        let mut runs = Vec::new();
        if parked.shared > 0 {
            let p =
                self.get(parent.ok_or(Error::State("the parked branch's parent is gone".into()))?)?;
            if (p.position as u32) < parked.shared || p.is_parked() {
                return Err(Error::State(format!("the parked branch shares {} cells with its parent, which holds {} now; it stays parked", parked.shared, p.position)));
            }
            kv.seq_cp(p.seq, seq, -1, parked.shared as Pos);
            let parent_runs = p.runs.clone();
            runs = self.segments.share_prefix(&parent_runs, parked.shared);
        }
        let end = kv.seq_pos_max(seq) + 1;
        if end != position && parked.shared + parked.own > 0 {
            self.segments.release_all(&runs);
            return Err(Error::State(format!("the resumed cells end at position {end}, not at the branch's {position}; it stays parked")));
        }
        self.segments.append(&mut runs, parked.own);
        Ok(runs)
    }

    /// Undoes a resume of this call: the sequence emptied and given back, the record back.
    fn repark(&mut self, kv: &impl KvBackend, h: Handle, parked: Parked) {
        let Ok(b) = self.get_mut(h) else { return };
        let (seq, runs) = (b.seq, std::mem::take(&mut b.runs));
        if let Cells::Disk { .. } = parked.cells {
            b.take_logits(); // the file still holds them
        }
        b.parked = Some(parked);
        kv.seq_rm(seq, -1, -1);
        self.release_lease(seq);
        self.segments.release_all(&runs);
    }

    /// The parked record of `h`, or None when it is live.
    pub fn parked(&self, h: Handle) -> Result<Option<&Parked>> {
        Ok(self.get(h)?.parked.as_ref())
    }

    fn parked_of(&self, h: Handle) -> Option<&Parked> {
        self.get(h).ok().and_then(|b| b.parked.as_ref())
    }

    fn depth(&self, mut h: Handle) -> usize {
        let mut depth = 0;
        while let Some(p) = self.get(h).ok().and_then(|b| b.parent) {
            (h, depth) = (p, depth + 1);
        }
        depth
    }

    /// `prune(h)` while a parked child needs `h`'s cells: `h` is parked (if live) and kept,
    /// out of the caller's sight, until the child is resumed or freed (`free_ghosts`). For the
    /// caller the branch is freed; its handle is reported as such.
    pub(super) fn keep_as_ghost(&mut self, kv: &impl KvBackend, h: Handle) -> Result<Vec<Handle>> {
        if !self.get(h)?.is_parked() {
            self.park_one(kv, h)?;
            self.spill_over_budget();
        }
        if !self.park_spill.ghosts.contains(&h) {
            self.park_spill.ghosts.push(h);
        }
        Ok(vec![h])
    }

    /// Frees every ghost no parked child needs any more, and parks again the ones a resume
    /// brought back for a child that others still need (a ghost never holds a lease for long).
    pub(super) fn free_ghosts(&mut self, kv: &impl KvBackend) {
        while let Some(i) = (self.park_spill.ghosts.iter())
            .position(|&g| !self.is_live(g) || self.check_parked_children(kv, g).is_ok())
        {
            let g = self.park_spill.ghosts.swap_remove(i);
            if self.is_live(g) {
                let _ = self.prune(kv, g);
            }
        }
        let back: Vec<Handle> = (self.park_spill.ghosts.iter().copied())
            .filter(|&g| self.get(g).is_ok_and(|b| !b.is_parked()))
            .collect();
        for g in back {
            let _ = self.park_one(kv, g); // on failure it stays live, and is still a ghost
        }
    }

    /// Whether `h` is a ghost (pruned for the caller, kept for its parked children).
    pub fn is_ghost(&self, h: Handle) -> bool {
        self.park_spill.ghosts.contains(&h)
    }

    /// Before `h` is freed: each parked child that shares cells with it must find them in
    /// `h`'s parent, which it is handed to. `ERR_BRANCH_PARKED` says which to resume otherwise.
    pub(super) fn check_parked_children(&self, kv: &impl KvBackend, h: Handle) -> Result<()> {
        let b = self.get(h)?;
        let grandparent = b.parent.and_then(|p| self.get(p).ok());
        let kept = match (&b.parked, grandparent) {
            (Some(p), Some(_)) => p.shared,
            (None, Some(g)) if !g.is_parked() => self.shareable(kv, g, b),
            _ => 0,
        };
        for &c in &b.children {
            if self.parked_of(c).is_some_and(|p| p.shared > kept) {
                return Err(Error::BranchParked(format!("a parked child of this branch needs {} of its cells; resume the child (or prune it) before freeing its parent", self.parked_of(c).map_or(0, |p| p.shared))));
            }
        }
        Ok(())
    }

    pub fn park_stats(&self) -> ParkStats {
        let mut stats = ParkStats {
            last_spill_error: self.park_spill.last_error.clone(),
            ..ParkStats::default()
        };
        for h in self.branches.handles() {
            let Some(b) = self.branches.get(h) else {
                continue;
            };
            match b.parked.as_ref().map(|p| &p.cells) {
                Some(Cells::Ram(state)) => {
                    stats.ram_bytes += state.len() as u64 + b.snapshot_bytes()
                }
                Some(Cells::Disk { bytes, .. }) => {
                    stats.disk_bytes += bytes;
                    stats.spilled += 1;
                }
                None => continue,
            }
            stats.parked += 1;
        }
        stats
    }

    /// Spills the oldest parked branches in RAM until the rest fit the budget. A failed write
    /// leaves that branch in RAM (nothing is lost) and is reported by `park_stats`.
    fn spill_over_budget(&mut self) {
        let Some(budget) = self.park_spill.ram_budget else {
            return;
        };
        let mut in_ram: Vec<(u64, Handle, u64)> = Vec::new();
        for h in self.branches.handles() {
            if let Some(b) = self.branches.get(h) {
                if let Some(Parked {
                    cells: Cells::Ram(state),
                    serial,
                    ..
                }) = &b.parked
                {
                    in_ram.push((*serial, h, state.len() as u64 + b.snapshot_bytes()));
                }
            }
        }
        in_ram.sort();
        let mut total: u64 = in_ram.iter().map(|x| x.2).sum();
        for (_, h, bytes) in in_ram {
            if total <= budget {
                break;
            }
            match self.spill(h) {
                Ok(()) => total -= bytes,
                Err(e) => {
                    self.park_spill.last_error = Some(e.to_string());
                    return;
                }
            }
        }
    }

    fn spill(&mut self, h: Handle) -> Result<()> {
        let spill = &self.park_spill;
        let (Some(dir), Some(fp)) = (&spill.dir, &spill.fingerprint) else {
            return Ok(());
        };
        let b = self.branches.get_mut(h).ok_or(Error::BranchDisposed)?;
        if !matches!(
            b.parked,
            Some(Parked {
                cells: Cells::Ram(_),
                ..
            })
        ) {
            return Ok(());
        }
        let (row, log_z) = b.take_logits();
        let Some(Parked {
            cells: Cells::Ram(state),
            serial,
            ..
        }) = &b.parked
        else {
            return Ok(());
        };
        let path = dir.join(format!("park-{}-{serial}.lbpark", std::process::id()));
        let mut meta = vec![log_z.is_some() as u8];
        meta.extend_from_slice(&log_z.unwrap_or(0.0).to_bits().to_le_bytes());
        let logits: Vec<u8> = row.iter().flat_map(|x| x.to_le_bytes()).collect();
        let bytes = container_bytes(
            Payload::Parked,
            fp,
            &[("kv", state), ("logits", &logits), ("meta", &meta)],
        );
        if let Err(e) = write_atomically(&path.to_string_lossy(), &bytes) {
            b.put_logits(row, log_z);
            return Err(e);
        }
        if let Some(p) = b.parked.as_mut() {
            p.cells = Cells::Disk {
                path,
                bytes: bytes.len() as u64,
            };
        }
        Ok(())
    }

    /// A spill file's cells and snapshot, checksum and fingerprint verified (a truncated file is
    /// `ERR_STATE_CORRUPT`, and the branch stays parked).
    fn read_spill(&self, path: &std::path::Path) -> Result<(Vec<u8>, Option<Snapshot>)> {
        let name = path.to_string_lossy();
        let fp = self.park_spill.fingerprint.as_ref().ok_or(Error::Internal(
            "a spilled branch without a spill fingerprint".into(),
        ))?;
        let bytes = read_file(&name)?;
        let sections = parse_container(&name, &bytes, Payload::Parked, fp)?;
        let section = |n: &str| -> Result<&[u8]> {
            let mut r = sections.reader(n)?;
            r.take(r.remaining())
        };
        let (state, logits, meta) = (section("kv")?, section("logits")?, section("meta")?);
        if meta.len() != 9 || logits.len() % 4 != 0 {
            return Err(Error::StateCorrupt(format!(
                "{name}: its snapshot is damaged"
            )));
        }
        let row = logits
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let log_z = (meta[0] == 1)
            .then(|| f64::from_bits(u64::from_le_bytes(meta[1..9].try_into().unwrap())));
        Ok((state.to_vec(), Some((row, log_z))))
    }
}
