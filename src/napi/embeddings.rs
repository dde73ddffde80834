//! Embeddings on `SessionContext` (contexts created with `embeddings: true`): `encode`,
//! `getEmbeddings`, `getEmbeddingDimension`, `hasPooling`.

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::context::{Engine, SessionContext};
use super::convert::{js, Arg, Result};
use super::raw::ensure_unleased;
use crate::engine::decode::{Output, Run};
use crate::error::Error;
use crate::llama::{SeqId, Token, POOLING_NONE, POOLING_RANK};

/// Scales `v` to unit L2 norm; a (near-)zero vector is left as it is.
fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 1e-8 {
        for x in v.iter_mut() {
            *x = (*x as f64 / norm) as f32;
        }
    }
}

impl SessionContext {
    fn require_embeddings(&self, what: &str) -> crate::error::Result<()> {
        self.live()?;
        if !self.info.embeddings {
            return Err(Error::Unsupported(format!(
                "{what} needs an embedding context; create one with createContext({{ modelPath, embeddings: true }})"
            )));
        }
        Ok(())
    }
}

#[napi]
impl SessionContext {
    /// Replaces sequence 0 with `tokens` (positions 0..n-1, one decode) and computes their
    /// embeddings. At most `nBatch` tokens.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn encode<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number[]")] tokens: Arg<Vec<f64>>,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            self.require_embeddings("encode")?;
            let tokens = self.tokens(&tokens.get("encode: tokens", "an array of token ids")?)?;
            if tokens.is_empty() {
                return Err(Error::invalid("encode needs at least one token"));
            }
            let limit = self.info.n_batch.min(self.info.n_ctx) as usize;
            if tokens.len() > limit {
                return Err(Error::invalid(format!(
                    "encode takes at most {limit} tokens (nBatch; nothing is truncated), got {}: shorten the input or create the context with a larger nBatch",
                    tokens.len()
                )));
            }
            Ok(move |e: &mut Engine| {
                ensure_unleased(e, 0, "encode")?;
                e.ctx.seq_rm(0, -1, -1);
                let run = [Run {
                    seq: 0,
                    start: 0,
                    tokens: &tokens,
                    output: Output::All,
                }];
                e.decode(&run, &|| false, &mut |_, _| Ok(()))
            })
        })
    }

    /// Embeds each of `inputs` (token arrays) on a sequence of its own, as many per decode as
    /// fit `nBatch` tokens and `nSeqMax` sequences: a pooled vector per input, in order
    /// (L2-normalised unless `normalize` is false). Every input is checked before anything runs.
    #[napi(ts_return_type = "Promise<Float32Array[]>")]
    pub fn embed_batch<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number[][]")] inputs: Arg<Vec<Vec<f64>>>,
        #[napi(ts_arg_type = "boolean | undefined | null")] normalize: Arg<Option<bool>>,
    ) -> Result<Object<'env>> {
        self.spawn(env, || {
            let normalize = normalize.get("embedBatch: normalize", "a boolean")?;
            let inputs = self.batch_inputs(inputs)?;
            let groups = batch_groups(
                &inputs,
                self.info.n_batch.min(self.info.n_ctx) as usize,
                self.info.n_seq_max as usize,
            );
            let normalize = normalize.unwrap_or(true);
            Ok(move |e: &mut Engine| {
                // Every sequence a group will use is free before any is cleared.
                let widest = groups.iter().map(|g| g.len()).max().unwrap_or(0);
                for seq in 0..widest as SeqId {
                    ensure_unleased(e, seq, "embedBatch")?;
                }
                let mut vectors = Vec::with_capacity(inputs.len());
                for group in groups {
                    vectors.extend(embed_group(e, &inputs[group], normalize)?);
                }
                Ok(vectors)
            })
        })
    }

    /// The inputs of `embedBatch`, checked: a pooled embedding context, each input non-empty,
    /// in the vocabulary and at most `nBatch` tokens.
    fn batch_inputs(&self, inputs: Arg<Vec<Vec<f64>>>) -> crate::error::Result<Vec<Vec<Token>>> {
        self.require_embeddings("embedBatch")?;
        if matches!(self.info.pooling, POOLING_NONE | POOLING_RANK) {
            return Err(Error::Unsupported(
                "embedBatch needs a pooled context (poolingType MEAN, CLS or LAST); use encode and getEmbeddings".into(),
            ));
        }
        let raw = inputs.get("embedBatch: inputs", "an array of token arrays")?;
        let limit = self.info.n_batch.min(self.info.n_ctx) as usize;
        let mut out = Vec::with_capacity(raw.len());
        for (i, item) in raw.iter().enumerate() {
            let tokens = self.tokens(item)?;
            if tokens.is_empty() || tokens.len() > limit {
                return Err(Error::invalid(format!(
                    "embedBatch: inputs[{i}] has {} tokens; each input takes 1 to {limit} (nBatch; nothing is truncated)",
                    tokens.len()
                )));
            }
            out.push(tokens);
        }
        Ok(out)
    }

    /// The embedding of the last `encode`: pooled over sequence 0, or the last token's when the
    /// context has no pooling. L2-normalised unless `normalize` is false.
    #[napi]
    pub fn get_embeddings(&self, normalize: Option<bool>) -> Result<Float32Array> {
        self.require_embeddings("getEmbeddings").map_err(js)?;
        let pooling = self.info.pooling;
        if pooling == POOLING_RANK {
            return Err(js(Error::Unsupported(
                "getEmbeddings does not support poolingType RANK (reranker scores); use MEAN, CLS, LAST or NONE".into(),
            )));
        }
        self.sync("getEmbeddings", |e| {
            let row = if pooling == POOLING_NONE {
                e.ctx.embeddings_ith(-1)
            } else {
                e.ctx.embeddings_seq(0)
            };
            let mut v = row
                .ok_or_else(|| {
                    Error::NoOutput("no embeddings yet: call encode(tokens) first".into())
                })?
                .to_vec();
            if normalize.unwrap_or(true) {
                l2_normalize(&mut v);
            }
            Ok(Float32Array::new(v))
        })
    }

    /// Length of the vectors `getEmbeddings()` returns (the model's embedding width).
    #[napi]
    pub fn get_embedding_dimension(&self) -> Result<i32> {
        self.live().map_err(js)?;
        Ok(self.model.n_embd_out())
    }

    /// True when the context pools token embeddings into one vector per sequence.
    #[napi]
    pub fn has_pooling(&self) -> Result<bool> {
        self.live().map_err(js)?;
        Ok(self.info.pooling != POOLING_NONE)
    }
}

/// Consecutive ranges of `inputs` that each fit one decode: at most `tokens` tokens (every
/// input fits alone) and `seqs` sequences.
fn batch_groups(inputs: &[Vec<Token>], tokens: usize, seqs: usize) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, input) in inputs.iter().enumerate() {
        if i > start && (used + input.len() > tokens || i - start == seqs.max(1)) {
            groups.push(start..i);
            (start, used) = (i, 0);
        }
        used += input.len();
    }
    if start < inputs.len() {
        groups.push(start..inputs.len());
    }
    groups
}

/// One decode of `inputs` on sequences 0.. (each cleared first; the caller checked that no
/// branch leases them), and their pooled vectors.
fn embed_group(
    e: &mut Engine,
    inputs: &[Vec<Token>],
    normalize: bool,
) -> crate::error::Result<Vec<Float32Array>> {
    for seq in 0..inputs.len() as SeqId {
        e.ctx.seq_rm(seq, -1, -1);
    }
    let runs: Vec<Run> = (inputs.iter().enumerate())
        .map(|(seq, tokens)| Run {
            seq: seq as SeqId,
            start: 0,
            tokens,
            output: Output::All,
        })
        .collect();
    e.decode(&runs, &|| false, &mut |_, _| Ok(()))?;
    let mut vectors = Vec::with_capacity(inputs.len());
    for seq in 0..inputs.len() as SeqId {
        let mut v = (e.ctx.embeddings_seq(seq))
            .ok_or_else(|| Error::NoOutput(format!("no pooled embedding for sequence {seq}")))?
            .to_vec();
        if normalize {
            l2_normalize(&mut v);
        }
        vectors.push(Float32Array::new(v));
    }
    for seq in 0..inputs.len() as SeqId {
        e.ctx.seq_rm(seq, -1, -1); // no KV growth between calls
    }
    Ok(vectors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_fit_one_decode_in_tokens_and_sequences() {
        let inputs: Vec<Vec<Token>> = [3, 4, 2, 5, 1, 1, 1].iter().map(|&n| vec![1; n]).collect();
        assert_eq!(batch_groups(&inputs, 8, 4), vec![0..2, 2..5, 5..7]);
        assert_eq!(batch_groups(&inputs, 100, 2), vec![0..2, 2..4, 4..6, 6..7]);
        assert_eq!(
            batch_groups(&inputs, 5, 8),
            vec![0..1, 1..2, 2..3, 3..4, 4..7]
        );
        assert!(batch_groups(&[], 8, 4).is_empty());
    }

    #[test]
    fn normalisation_gives_unit_norm_and_keeps_zero_vectors() {
        let mut v = [3.0f32, 4.0];
        l2_normalize(&mut v);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
        let mut z = [0.0f32; 3];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }
}
