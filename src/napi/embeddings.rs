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
use crate::llama::{POOLING_NONE, POOLING_RANK};

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

#[cfg(test)]
mod tests {
    use super::*;

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
