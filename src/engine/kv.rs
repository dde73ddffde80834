//! `KvBackend`: what the engine needs from a llama.cpp context — its KV memory, one decode, and
//! the logits rows of that decode. `llama::Context` implements it; the engine's unit tests use
//! an in-memory fake (`engine::fake`) so the store and the decode engine are tested without a
//! model.

use crate::error::Result;
use crate::llama::{Batch, Context, Pos, SeqId};

pub trait KvBackend {
    /// KV cells (the largest position + 1 any sequence may reach).
    fn n_ctx(&self) -> u32;
    /// Tokens one decode may take.
    fn n_batch(&self) -> u32;
    /// Output rows one decode may request.
    fn n_outputs_max(&self) -> u32;
    /// Length of one logits row.
    fn n_vocab(&self) -> i32;
    /// Sliding-window attention span (0 = none). llama.cpp may reuse a sequence's cells that
    /// have left its window for other tokens, so they cannot be shared with a later fork.
    fn n_swa(&self) -> u32;
    /// Highest position of `seq`, or -1 when it holds no cells.
    fn seq_pos_max(&self, seq: SeqId) -> Pos;
    /// Lowest position of `seq`, or -1 when it holds no cells.
    fn seq_pos_min(&self, seq: SeqId) -> Pos;
    /// Removes positions `[p0, p1)` of `seq` (negative = open end); false when refused.
    fn seq_rm(&self, seq: SeqId, p0: Pos, p1: Pos) -> bool;
    /// Tags `dst` on `src`'s cells in `[p0, p1)` (shared, not copied).
    fn seq_cp(&self, src: SeqId, dst: SeqId, p0: Pos, p1: Pos);
    /// Removes every cell not tagged with `seq`.
    fn seq_keep(&self, seq: SeqId);
    /// Removes every cell.
    fn clear(&self);
    /// One decode of an already validated batch.
    fn decode(&mut self, batch: &mut Batch) -> Result<()>;
    /// One decode of a batch of embedding rows (an image's), with non-causal attention when the
    /// projector asks for it; the batch fits one ubatch.
    fn decode_embd(&mut self, batch: &mut Batch, non_causal: bool) -> Result<()>;
    /// The logits of batch row `i` of the last decode (`-1` = the last output).
    fn logits_row(&self, i: i32) -> Result<&[f32]>;

    /// The state of `seq`'s cells (llama.cpp's per-sequence format, beginning with its magic
    /// and the sequence id).
    fn seq_state(&self, seq: SeqId) -> Result<Vec<u8>>;
    /// Replaces `seq`'s cells with a `seq_state`; the bytes consumed (0 = refused).
    fn set_seq_state(&self, seq: SeqId, data: &[u8]) -> usize;

    /// Number of cells `seq` spans (positions are contiguous within a sequence).
    fn seq_extent(&self, seq: SeqId) -> u32 {
        let max = self.seq_pos_max(seq);
        if max < 0 {
            return 0;
        }
        (max - self.seq_pos_min(seq).max(0) + 1).max(0) as u32
    }
}

impl KvBackend for Context {
    fn n_ctx(&self) -> u32 {
        Context::n_ctx(self)
    }
    fn n_batch(&self) -> u32 {
        Context::n_batch(self)
    }
    fn n_outputs_max(&self) -> u32 {
        Context::n_outputs_max(self)
    }
    fn n_vocab(&self) -> i32 {
        Context::n_vocab(self)
    }
    fn n_swa(&self) -> u32 {
        self.model.n_swa()
    }
    fn seq_pos_max(&self, seq: SeqId) -> Pos {
        Context::seq_pos_max(self, seq)
    }
    fn seq_pos_min(&self, seq: SeqId) -> Pos {
        Context::seq_pos_min(self, seq)
    }
    fn seq_rm(&self, seq: SeqId, p0: Pos, p1: Pos) -> bool {
        Context::seq_rm(self, seq, p0, p1)
    }
    fn seq_cp(&self, src: SeqId, dst: SeqId, p0: Pos, p1: Pos) {
        Context::seq_cp(self, src, dst, p0, p1)
    }
    fn seq_keep(&self, seq: SeqId) {
        Context::seq_keep(self, seq)
    }
    fn clear(&self) {
        Context::clear_memory(self)
    }
    fn decode(&mut self, batch: &mut Batch) -> Result<()> {
        Context::decode(self, batch)
    }
    fn decode_embd(&mut self, batch: &mut Batch, non_causal: bool) -> Result<()> {
        Context::decode_embd(self, batch, non_causal)
    }
    fn logits_row(&self, i: i32) -> Result<&[f32]> {
        Context::logits_row(self, i)
    }
    fn seq_state(&self, seq: SeqId) -> Result<Vec<u8>> {
        Context::seq_state(self, seq)
    }
    fn set_seq_state(&self, seq: SeqId, data: &[u8]) -> usize {
        Context::set_seq_state(self, seq, data)
    }
}
