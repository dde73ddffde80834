//! An in-memory `KvBackend` for unit tests: cells tagged with sequence ids as llama.cpp's
//! unified KV cache keeps them, positions checked as llama.cpp checks them, deterministic logits,
//! and failures on demand. No model, no llama.cpp context.

use std::cell::RefCell;
use std::collections::BTreeSet;

use super::kv::KvBackend;
use crate::error::{Error, Result};
use crate::llama::{Batch, Pos, SeqId};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cell {
    pub pos: Pos,
    pub seqs: BTreeSet<SeqId>,
}

pub struct FakeKv {
    n_ctx: u32,
    n_seq_max: u32,
    n_vocab: i32,
    pub n_batch: u32,
    n_outputs_max: u32,
    /// Sliding window the fake reports (it keeps every cell regardless).
    pub n_swa: u32,
    cells: RefCell<Vec<Cell>>,
    rows: Vec<Vec<f32>>,
    row_of_batch_index: Vec<Option<usize>>,
    decodes: Vec<usize>,
    fail_after: Option<usize>,
}

impl FakeKv {
    pub fn new(n_ctx: u32, n_seq_max: u32) -> FakeKv {
        FakeKv {
            n_ctx,
            n_seq_max,
            n_vocab: 16,
            n_batch: n_ctx,
            n_outputs_max: n_seq_max.max(1) * 8,
            n_swa: 0,
            cells: RefCell::new(Vec::new()),
            rows: Vec::new(),
            row_of_batch_index: Vec::new(),
            decodes: Vec::new(),
            fail_after: None,
        }
    }

    /// The first logit of the row the fake computes for `token` at `pos` in `seq`.
    pub fn logit0(seq: SeqId, pos: Pos, token: i32) -> f32 {
        (seq * 1000 + pos * 10 + token) as f32
    }

    /// The next `n` decodes succeed, the one after fails (`ERR_DECODE`), and later ones succeed.
    pub fn fail_decode_after(&mut self, n: usize) {
        self.fail_after = Some(self.decodes.len() + n);
    }

    /// Token counts of every decode so far.
    pub fn decode_sizes(&self) -> Vec<usize> {
        self.decodes.clone()
    }

    /// The cells, sorted, for comparing states.
    pub fn snapshot(&self) -> Vec<Cell> {
        let mut cells = self.cells.borrow().clone();
        cells.sort();
        cells
    }

    /// Cells in use (tagged by at least one sequence).
    pub fn cells_used(&self) -> u32 {
        self.cells.borrow().len() as u32
    }

    fn check_seq(&self, seq: SeqId) {
        assert!(
            seq >= 0 && (seq as u32) < self.n_seq_max,
            "seq {seq} out of range"
        );
    }

    fn positions(&self, seq: SeqId) -> impl Iterator<Item = Pos> + '_ {
        self.check_seq(seq);
        let cells = self.cells.borrow();
        let v: Vec<Pos> = cells
            .iter()
            .filter(|c| c.seqs.contains(&seq))
            .map(|c| c.pos)
            .collect();
        v.into_iter()
    }
}

impl KvBackend for FakeKv {
    fn n_ctx(&self) -> u32 {
        self.n_ctx
    }
    fn n_batch(&self) -> u32 {
        self.n_batch
    }
    fn n_outputs_max(&self) -> u32 {
        self.n_outputs_max
    }
    fn n_vocab(&self) -> i32 {
        self.n_vocab
    }
    fn n_swa(&self) -> u32 {
        self.n_swa
    }
    fn seq_pos_max(&self, seq: SeqId) -> Pos {
        self.positions(seq).max().unwrap_or(-1)
    }
    fn seq_pos_min(&self, seq: SeqId) -> Pos {
        self.positions(seq).min().unwrap_or(-1)
    }
    fn seq_rm(&self, seq: SeqId, p0: Pos, p1: Pos) -> bool {
        self.check_seq(seq);
        let (p0, p1) = (p0.max(0), if p1 < 0 { Pos::MAX } else { p1 });
        let mut cells = self.cells.borrow_mut();
        for c in cells.iter_mut().filter(|c| c.pos >= p0 && c.pos < p1) {
            c.seqs.remove(&seq);
        }
        cells.retain(|c| !c.seqs.is_empty());
        true
    }
    fn seq_cp(&self, src: SeqId, dst: SeqId, p0: Pos, p1: Pos) {
        self.check_seq(src);
        self.check_seq(dst);
        let (p0, p1) = (p0.max(0), if p1 < 0 { Pos::MAX } else { p1 });
        for c in self.cells.borrow_mut().iter_mut() {
            if c.pos >= p0 && c.pos < p1 && c.seqs.contains(&src) {
                c.seqs.insert(dst);
            }
        }
    }
    fn seq_keep(&self, seq: SeqId) {
        self.check_seq(seq);
        let mut cells = self.cells.borrow_mut();
        cells.retain(|c| c.seqs.contains(&seq));
        for c in cells.iter_mut() {
            c.seqs.retain(|&s| s == seq);
        }
    }
    fn clear(&self) {
        self.cells.borrow_mut().clear();
    }
    fn decode_embd(&mut self, batch: &mut Batch, _non_causal: bool) -> Result<()> {
        // Each embedding row stands in for a token (id 0) at its position.
        self.decode(batch)
    }

    fn decode(&mut self, batch: &mut Batch) -> Result<()> {
        assert!(batch.len() <= self.n_batch as usize, "batch over n_batch");
        assert!(
            batch.n_outputs() <= self.n_outputs_max as usize,
            "too many outputs"
        );
        let failing = self.fail_after == Some(self.decodes.len());
        self.decodes.push(batch.len());
        if failing {
            return Err(Error::Decode {
                code: -3,
                what: "injected failure".into(),
            });
        }
        // llama.cpp's checks: each sequence continues at its end, consecutively.
        let mut next: std::collections::BTreeMap<SeqId, Pos> = Default::default();
        for i in 0..batch.len() {
            let (_, pos, seq, _) = batch.row(i);
            let expected = *next.entry(seq).or_insert_with(|| {
                let max = self.seq_pos_max(seq);
                if max < 0 {
                    pos
                } else {
                    max + 1
                }
            });
            assert_eq!(pos, expected, "inconsistent position for seq {seq}");
            next.insert(seq, pos + 1);
        }
        if self.cells.borrow().len() + batch.len() > self.n_ctx as usize {
            return Err(Error::KvFull("fake cache is full".into()));
        }
        self.rows.clear();
        self.row_of_batch_index.clear();
        let mut cells = self.cells.borrow_mut();
        for i in 0..batch.len() {
            let (token, pos, seq, output) = batch.row(i);
            cells.push(Cell {
                pos,
                seqs: BTreeSet::from([seq]),
            });
            if output {
                let mut row = vec![0.0; self.n_vocab as usize];
                row[0] = FakeKv::logit0(seq, pos, token);
                row[(token.unsigned_abs() as usize) % self.n_vocab as usize] += 1.0;
                self.row_of_batch_index.push(Some(self.rows.len()));
                self.rows.push(row);
            } else {
                self.row_of_batch_index.push(None);
            }
        }
        Ok(())
    }
    /// Magic, the sequence id, then each position (4 bytes each).
    fn seq_state(&self, seq: SeqId) -> Result<Vec<u8>> {
        let mut out = crate::llama::SEQ_STATE_MAGIC.to_le_bytes().to_vec();
        out.extend_from_slice(&seq.to_le_bytes());
        let mut positions: Vec<Pos> = self.positions(seq).collect();
        positions.sort();
        for p in positions {
            out.extend_from_slice(&p.to_le_bytes());
        }
        Ok(out)
    }
    fn set_seq_state(&self, seq: SeqId, data: &[u8]) -> usize {
        self.seq_rm(seq, -1, -1);
        if data.len() < 8 || !data.len().is_multiple_of(4) {
            return 0;
        }
        let n = (data.len() - 8) / 4;
        if self.cells.borrow().len() + n > self.n_ctx as usize {
            return 0;
        }
        for b in data[8..].chunks_exact(4) {
            self.cells.borrow_mut().push(Cell {
                pos: i32::from_le_bytes(b.try_into().unwrap()),
                seqs: BTreeSet::from([seq]),
            });
        }
        data.len()
    }
    fn logits_row(&self, i: i32) -> Result<&[f32]> {
        let index = if i < 0 {
            self.rows.len().checked_sub(i.unsigned_abs() as usize)
        } else {
            self.row_of_batch_index.get(i as usize).copied().flatten()
        };
        index
            .and_then(|r| self.rows.get(r))
            .map(|r| r.as_slice())
            .ok_or(Error::NoLogits)
    }
}
