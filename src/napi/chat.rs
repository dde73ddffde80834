//! Chat helpers on `SessionContext`: `formatChat`, `parseChatOutput`, `validateChatTemplate`,
//! `getTurnSeparator`. Templates are rendered and outputs parsed by llama.cpp's own chat layer
//! through the C++ shim (`llama::chat`); this file checks the JS arguments and moves JSON across.

use napi::bindgen_prelude::*;
use napi::{Env, JsValue};
use napi_derive::napi;

use super::context::{Engine, SessionContext};
use super::convert::{js, napi_failed, Arg};
use crate::error::{Error, Result};
use crate::llama::chat::{self as chat_ffi, FormatRequest, ParseRequest};
use crate::llama::{Model, Token};

/// JSON text produced natively, handed to JS as the value `JSON.parse` makes of it.
pub struct JsonText(pub String);

/// `JSON.parse` or `JSON.stringify` of this env's global object, through napi-rs's `Function`:
/// calling it clears an exception it throws and reports it as an `Err`.
fn json_function<'env, Args: JsValuesTupleIntoVec, Return: FromNapiValue>(
    env: &Env,
    method: &str,
) -> napi::Result<Function<'env, Args, Return>> {
    let json: Object = env.get_global()?.get_named_property_unchecked("JSON")?;
    json.get_named_property_unchecked(method)
}

impl ToNapiValue for JsonText {
    // SAFETY: napi-rs calls this with the live env of the current call; nothing else is unsafe.
    unsafe fn to_napi_value(
        env: napi::sys::napi_env,
        val: Self,
    ) -> napi::Result<napi::sys::napi_value> {
        let env = Env::from_raw(env);
        let parse: Function<String, Unknown> = json_function(&env, "parse")?;
        Ok(parse.call(val.0)?.raw())
    }
}

/// A string argument as is; anything else (array, object) as its `JSON.stringify` text.
fn json_text_of(env: &Env, value: &Unknown, what: &str) -> Result<String> {
    match value.get_type().map_err(napi_failed)? {
        ValueType::String => String::from_unknown(*value).map_err(napi_failed),
        ValueType::Object => {
            let stringify: Function<Unknown, Option<String>> =
                json_function(env, "stringify").map_err(napi_failed)?;
            // A throwing toJSON or a cyclic value: JSON.stringify throws, `call` clears it.
            match stringify.call(*value) {
                Ok(Some(text)) => Ok(text),
                _ => Err(Error::invalid(format!(
                    "{what} could not be converted with JSON.stringify (cyclic or not serialisable)"
                ))),
            }
        }
        other => Err(Error::invalid(format!(
            "{what} must be a JSON string or an array/object, got {}",
            type_name(other)
        ))),
    }
}

fn type_name(t: ValueType) -> &'static str {
    match t {
        ValueType::Undefined => "undefined",
        ValueType::Null => "null",
        ValueType::Boolean => "a boolean",
        ValueType::Number => "a number",
        ValueType::String => "a string",
        ValueType::Symbol => "a symbol",
        ValueType::Object => "an object",
        ValueType::Function => "a function",
        ValueType::BigInt => "a bigint",
        _ => "an unsupported value",
    }
}

/// Reads `options[key]`: `None` when absent, undefined or null.
fn field<'a>(options: &'a Object, key: &str) -> Result<Option<Unknown<'a>>> {
    let value: Option<Unknown> = options.get(key).map_err(napi_failed)?;
    Ok(match value {
        Some(v)
            if !matches!(
                v.get_type().map_err(napi_failed)?,
                ValueType::Undefined | ValueType::Null
            ) =>
        {
            Some(v)
        }
        _ => None,
    })
}

fn string_field(options: &Object, key: &str) -> Result<Option<String>> {
    match field(options, key)? {
        None => Ok(None),
        Some(v) if v.get_type().map_err(napi_failed)? == ValueType::String => {
            Ok(Some(String::from_unknown(v).map_err(napi_failed)?))
        }
        Some(v) => Err(Error::invalid(format!(
            "options.{key} must be a string, got {}",
            type_name(v.get_type().map_err(napi_failed)?)
        ))),
    }
}

fn bool_field(options: &Object, key: &str) -> Result<Option<bool>> {
    match field(options, key)? {
        None => Ok(None),
        Some(v) if v.get_type().map_err(napi_failed)? == ValueType::Boolean => {
            Ok(Some(bool::from_unknown(v).map_err(napi_failed)?))
        }
        Some(v) => Err(Error::invalid(format!(
            "options.{key} must be a boolean, got {}",
            type_name(v.get_type().map_err(napi_failed)?)
        ))),
    }
}

fn json_field(env: &Env, options: &Object, key: &str) -> Result<Option<String>> {
    field(options, key)?
        .map(|v| json_text_of(env, &v, &format!("options.{key}")))
        .transpose()
}

/// `reasoningFormat` of parseChatOutput: the number formatChat reports, or a format name.
fn reasoning_number(options: &Object) -> Result<i32> {
    let Some(v) = field(options, "reasoningFormat")? else {
        return Ok(0);
    };
    match v.get_type().map_err(napi_failed)? {
        ValueType::Number => {
            let n = f64::from_unknown(v).map_err(napi_failed)?;
            if n.fract() != 0.0 || !(0.0..=3.0).contains(&n) {
                return Err(Error::invalid(format!(
                    "options.reasoningFormat must be 0..3 (ReasoningFormat), got {n}"
                )));
            }
            Ok(n as i32)
        }
        ValueType::String => {
            let s = String::from_unknown(v).map_err(napi_failed)?;
            match s.as_str() {
                "none" => Ok(0),
                "auto" => Ok(1),
                "deepseek_legacy" | "deepseek-legacy" => Ok(2),
                "deepseek" => Ok(3),
                _ => Err(Error::invalid(format!(
                    "options.reasoningFormat must be \"none\", \"auto\", \"deepseek\" or \"deepseek_legacy\", got \"{s}\""
                ))),
            }
        }
        other => Err(Error::invalid(format!(
            "options.reasoningFormat must be a number or a string, got {}",
            type_name(other)
        ))),
    }
}

/// The request of a `formatChat` call; `context_template` (the context's `chatTemplate`) when the
/// call names no template of its own.
fn format_request(
    env: &Env,
    messages: Unknown,
    options: Option<Either<String, Object>>,
    context_template: Option<&str>,
) -> Result<FormatRequest> {
    let mut req = FormatRequest {
        messages_json: json_text_of(env, &messages, "messages")?,
        enable_thinking: true,
        add_generation_prompt: true,
        ..FormatRequest::default()
    };
    match options {
        None => {}
        // The older call shape: a template override as the second argument.
        Some(Either::A(template)) => req.template_override = Some(template),
        Some(Either::B(o)) => {
            req.template_override = string_field(&o, "templateOverride")?;
            req.tools_json = json_field(env, &o, "tools")?;
            req.tool_choice = string_field(&o, "toolChoice")?;
            req.reasoning_format = string_field(&o, "reasoningFormat")?;
            req.json_schema = json_field(env, &o, "jsonSchema")?;
            req.grammar = string_field(&o, "grammar")?;
            req.parallel_tool_calls = bool_field(&o, "parallelToolCalls")?.unwrap_or(false);
            req.enable_thinking = bool_field(&o, "enableThinking")?.unwrap_or(true);
            req.add_generation_prompt = bool_field(&o, "addGenerationPrompt")?.unwrap_or(true);
        }
    }
    if req.template_override.as_deref().unwrap_or("").is_empty() {
        req.template_override = context_template.map(str::to_string);
    }
    Ok(req)
}

/// Tokens that close an assistant turn: the template's text between an assistant message and
/// the next user message, tokenized, up to and including its first end-of-generation token plus
/// any whitespace-only tokens after it. `None` when the template gives nothing usable.
fn turn_separator_from_template(model: &Model, template: Option<&str>) -> Option<Vec<Token>> {
    let text = chat_ffi::turn_text(model, template).ok()?;
    let tokens = model.tokenize(&text, false, true).ok()?;
    let eog = tokens.iter().position(|&t| model.is_eog(t))?;
    let mut end = eog + 1;
    while end < tokens.len() {
        let piece = model.token_to_text(tokens[end]);
        if piece.is_empty() || !piece.chars().all(char::is_whitespace) {
            break;
        }
        end += 1;
    }
    Some(tokens[..end].to_vec())
}

fn turn_separator(model: &Model, template: Option<&str>) -> Result<Vec<Token>> {
    if let Some(tokens) = turn_separator_from_template(model, template) {
        return Ok(tokens);
    }
    model
        .eog_token()
        .map(|t| vec![t])
        .ok_or_else(|| Error::Unsupported("Model has no EOT or EOS token".into()))
}

/// llama.cpp's chat format names in number order (lib/index.js builds `ChatFormat` from them).
#[napi(js_name = "_chatFormatNames")]
pub fn chat_format_names() -> super::convert::Result<Vec<String>> {
    chat_ffi::format_names().map_err(js)
}

#[napi]
impl SessionContext {
    /// Renders `messages` with the model's Jinja chat template (llama.cpp's chat layer).
    #[napi(
        ts_args_type = "messages: string | readonly ChatMessage[], options?: FormatChatOptions | string",
        ts_return_type = "Promise<FormattedChatResult>"
    )]
    pub fn format_chat<'env>(
        &self,
        env: &'env Env,
        messages: Unknown,
        options: Arg<Option<Either<String, Object>>>,
    ) -> super::convert::Result<Object<'env>> {
        let model = self.model.clone();
        self.spawn_keeping_logits(env, || {
            let options = options.get(
                "formatChat: options",
                "a FormatChatOptions object or a template string",
            )?;
            let req = format_request(env, messages, options, self.chat_template.as_deref())?;
            Ok(move |_: &mut Engine| chat_ffi::format_chat(&model, &req).map(JsonText))
        })
    }

    /// `formatChat` on the calling thread: the template renders while JS waits.
    #[napi(
        js_name = "formatChatSync",
        ts_args_type = "messages: string | readonly ChatMessage[], options?: FormatChatOptions | string",
        ts_return_type = "FormattedChatResult"
    )]
    pub fn format_chat_sync(
        &self,
        env: Env,
        messages: Unknown,
        options: Option<Either<String, Object>>,
    ) -> super::convert::Result<JsonText> {
        self.live().map_err(js)?;
        let req =
            format_request(&env, messages, options, self.chat_template.as_deref()).map_err(js)?;
        chat_ffi::format_chat(&self.model, &req)
            .map(JsonText)
            .map_err(js)
    }

    /// Parses model output in the given chat format into content, reasoning and tool calls.
    #[napi(ts_return_type = "ParseChatOutputResult")]
    pub fn parse_chat_output(
        &self,
        output: String,
        format: f64,
        options: Option<Object>,
    ) -> super::convert::Result<JsonText> {
        self.live().map_err(js)?;
        if !format.is_finite() || format.fract() != 0.0 || !(0.0..=1e6).contains(&format) {
            return Err(js(Error::invalid(format!(
                "format must be the chat format number from formatChat(), got {format}"
            ))));
        }
        let mut req = ParseRequest {
            output,
            format: format as i32,
            ..ParseRequest::default()
        };
        if let Some(o) = &options {
            req.reasoning_format = reasoning_number(o).map_err(js)?;
            req.is_partial = bool_field(o, "isPartial").map_err(js)?.unwrap_or(false);
            req.parser = string_field(o, "parser").map_err(js)?;
            req.generation_prompt = string_field(o, "generationPrompt").map_err(js)?;
            let forced_open = bool_field(o, "thinkingForcedOpen")
                .map_err(js)?
                .unwrap_or(false);
            let has_parser = req.parser.as_deref().is_some_and(|p| !p.is_empty());
            if forced_open && has_parser && req.generation_prompt.is_none() {
                return Err(js(Error::invalid(
                    "options.thinkingForcedOpen needs options.generationPrompt: pass the formatChat() result's generationPrompt (or the whole result as options)",
                )));
            }
        }
        chat_ffi::parse_chat_output(&req).map(JsonText).map_err(js)
    }

    /// Whether `template` is a Jinja chat template llama.cpp can parse and render.
    #[napi(ts_return_type = "Promise<boolean>")]
    pub fn validate_chat_template<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "string")] template: Arg<String>,
    ) -> super::convert::Result<Object<'env>> {
        self.spawn_keeping_logits(env, || {
            let template = template.get("validateChatTemplate: template", "a string")?;
            Ok(move |_: &mut Engine| Ok(chat_ffi::verify_template(&template).is_ok()))
        })
    }

    /// Tokens that close an assistant turn before the next message (cached per context).
    #[napi]
    pub fn get_turn_separator(&self) -> super::convert::Result<Vec<i32>> {
        self.live().map_err(js)?;
        if let Some(tokens) = self.turn_separator.get() {
            return Ok(tokens.clone());
        }
        let tokens = turn_separator(&self.model, self.chat_template.as_deref()).map_err(js)?;
        Ok(self.turn_separator.get_or_init(|| tokens).clone())
    }
}
