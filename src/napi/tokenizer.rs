//! Tokenizer members of `SessionContext`. They use the model only (never the context), so the
//! async ones run on the worker without touching logits and the sync ones never wait.

use napi::bindgen_prelude::*;
use napi::Env;
use napi_derive::napi;

use super::context::{Engine, SessionContext};
use super::convert::{js, Arg, Result};
use crate::error::Error;

#[napi]
impl SessionContext {
    #[napi(
        ts_args_type = "text: string, addSpecial?: boolean, parseSpecial?: boolean",
        ts_return_type = "Promise<number[]>"
    )]
    pub fn tokenize<'env>(
        &self,
        env: &'env Env,
        text: Arg<String>,
        add_special: Arg<Option<bool>>,
        parse_special: Arg<Option<bool>>,
    ) -> Result<Object<'env>> {
        let model = self.model.clone();
        self.spawn_keeping_logits(env, || {
            let text = text.get("tokenize: text", "a string")?;
            let add_special = add_special
                .get("tokenize: addSpecial", "a boolean")?
                .unwrap_or(true);
            let parse_special = parse_special
                .get("tokenize: parseSpecial", "a boolean")?
                .unwrap_or(true);
            Ok(move |_: &mut Engine| model.tokenize(&text, add_special, parse_special))
        })
    }

    #[napi(ts_return_type = "Promise<string>")]
    pub fn detokenize<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "number[]")] tokens: Arg<Vec<f64>>,
    ) -> Result<Object<'env>> {
        let model = self.model.clone();
        self.spawn_keeping_logits(env, || {
            let tokens =
                self.tokens(&tokens.get("detokenize: tokens", "an array of token ids")?)?;
            Ok(move |_: &mut Engine| Ok(model.detokenize(&tokens)))
        })
    }

    #[napi]
    pub fn tokenize_sync(
        &self,
        text: String,
        add_special: Option<bool>,
        parse_special: Option<bool>,
    ) -> Result<Vec<i32>> {
        self.live().map_err(js)?;
        self.model
            .tokenize(
                &text,
                add_special.unwrap_or(true),
                parse_special.unwrap_or(true),
            )
            .map_err(js)
    }

    #[napi]
    pub fn token_to_text(&self, token: f64) -> Result<String> {
        self.live().map_err(js)?;
        Ok(self.model.token_to_text(self.token(token).map_err(js)?))
    }

    #[napi]
    pub fn is_stop_token(&self, token: f64) -> Result<bool> {
        self.live().map_err(js)?;
        Ok(self.model.is_eog(self.token(token).map_err(js)?))
    }

    #[napi]
    pub fn get_eog_token(&self) -> Result<i32> {
        self.live().map_err(js)?;
        self.model
            .eog_token()
            .ok_or_else(|| js(Error::Unsupported("Model has no EOT or EOS token".into())))
    }

    #[napi]
    pub fn get_bos_token(&self) -> Result<Option<i32>> {
        self.live().map_err(js)?;
        Ok(self.model.bos_token())
    }
}
