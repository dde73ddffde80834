//! `Batch`: owned arrays behind a `llama_batch` view. Each token belongs to exactly one sequence.
//! A batch holds token ids, or (`push_embd`) embedding rows fed to the model in their place
//! (an image's, from a projector); never both.

use llama_cpp_sys_2 as sys;

use super::{Pos, SeqId, Token};

#[derive(Default)]
pub struct Batch {
    tokens: Vec<Token>,
    positions: Vec<Pos>,
    n_seq_id: Vec<i32>,
    seq_ids: Vec<SeqId>,
    seq_id_ptrs: Vec<*mut SeqId>,
    logits: Vec<i8>,
    /// Embedding rows (`n_embd` floats each) instead of token ids; empty for a token batch.
    embd: Vec<f32>,
}

// SAFETY: the only raw pointers are `seq_id_ptrs`, which point into `seq_ids` of the same value
// and are rebuilt before every use (`as_raw`); moving the batch to another thread moves both.
unsafe impl Send for Batch {}

impl Batch {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.n_seq_id.clear();
        self.seq_ids.clear();
        self.logits.clear();
        self.embd.clear();
    }

    pub fn push(&mut self, token: Token, pos: Pos, seq: SeqId, want_logits: bool) {
        self.tokens.push(token);
        self.positions.push(pos);
        self.n_seq_id.push(1);
        self.seq_ids.push(seq);
        self.logits.push(want_logits as i8);
    }

    /// One embedding row in place of a token (the row's width must be the model's input
    /// embedding width, which `Context::decode_embd` checks). Not mixed with `push`.
    pub fn push_embd(&mut self, row: &[f32], pos: Pos, seq: SeqId, want_logits: bool) {
        self.embd.extend_from_slice(row);
        self.push(0, pos, seq, want_logits);
    }

    /// Floats of embedding rows held (0 for a token batch).
    pub fn embd_len(&self) -> usize {
        self.embd.len()
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Row `i`: (token, position, sequence, whether it requests an output). For backends that
    /// read a batch themselves (the engine's test backend).
    pub fn row(&self, i: usize) -> (Token, Pos, SeqId, bool) {
        (
            self.tokens[i],
            self.positions[i],
            self.seq_ids[i],
            self.logits[i] != 0,
        )
    }

    /// Rows of this batch that request an output (logits or embeddings).
    pub fn n_outputs(&self) -> usize {
        self.logits.iter().filter(|&&l| l != 0).count()
    }

    /// The `llama_batch` view, valid until this batch is next modified. The pointer table is
    /// rebuilt here, after all pushes, so no reallocation can dangle it.
    pub(super) fn as_raw(&mut self) -> sys::llama_batch {
        self.seq_id_ptrs.clear();
        let base = self.seq_ids.as_mut_ptr();
        // SAFETY: every `i` is in bounds of `seq_ids`, so each pointer stays inside it.
        self.seq_id_ptrs
            .extend((0..self.seq_ids.len()).map(|i| unsafe { base.add(i) }));
        sys::llama_batch {
            n_tokens: self.tokens.len() as i32,
            // llama.cpp reads `embd` when it is set and `token` otherwise.
            token: if self.embd.is_empty() {
                self.tokens.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            },
            embd: if self.embd.is_empty() {
                std::ptr::null_mut()
            } else {
                self.embd.as_mut_ptr()
            },
            pos: self.positions.as_mut_ptr(),
            n_seq_id: self.n_seq_id.as_mut_ptr(),
            seq_id: self.seq_id_ptrs.as_mut_ptr(),
            logits: self.logits.as_mut_ptr(),
        }
    }
}
