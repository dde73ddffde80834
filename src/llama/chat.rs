//! FFI to `src/llama/chat_shim.cpp`, the C ABI over llama.cpp's chat layer (common/chat.h): chat
//! template rendering, output parsing, template validation. The shim catches every C++
//! exception and reports a status and a message; results come back as malloc'd JSON text that
//! is copied into Rust and freed here.

use std::ffi::{c_char, c_int, CStr, CString};

use llama_cpp_sys_2 as sys;

use super::Model;
use crate::error::{Error, Result};

const LB_OK: c_int = 0;
const LB_INVALID_INPUT: c_int = 1;
const LB_TEMPLATE: c_int = 2;
const LB_PARSE: c_int = 3;

#[repr(C)]
struct FormatArgs {
    messages_json: *const c_char,
    template_override: *const c_char,
    tools_json: *const c_char,
    tool_choice: *const c_char,
    reasoning_format: *const c_char,
    json_schema: *const c_char,
    grammar: *const c_char,
    parallel_tool_calls: bool,
    enable_thinking: bool,
    add_generation_prompt: bool,
}

#[repr(C)]
struct ParseArgs {
    output: *const c_char,
    format: c_int,
    reasoning_format: c_int,
    is_partial: bool,
    generation_prompt: *const c_char,
    parser: *const c_char,
}

extern "C" {
    fn lb_chat_free(p: *mut c_char);
    fn lb_chat_set_log_verbosity(verbosity: c_int);
    fn lb_chat_format(
        model: *const sys::llama_model,
        args: *const FormatArgs,
        out: *mut *mut c_char,
    ) -> c_int;
    fn lb_chat_parse(args: *const ParseArgs, out: *mut *mut c_char) -> c_int;
    fn lb_chat_verify_template(template_src: *const c_char, out: *mut *mut c_char) -> c_int;
    fn lb_chat_format_names(out: *mut *mut c_char) -> c_int;
    fn lb_chat_turn_text(
        model: *const sys::llama_model,
        template_override: *const c_char,
        sentinel_a: *const c_char,
        sentinel_b: *const c_char,
        out: *mut *mut c_char,
    ) -> c_int;
}

/// A pointer moved to the parser thread; its referent outlives the call (the caller blocks).
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: only used to hand a pointer to the scoped parser thread while the calling thread
// blocks on it, so the pointee is alive and not used concurrently.
unsafe impl<T> Send for SendPtr<T> {}

/// Brings llama.cpp's common logger (used by the chat layer) to the addon's log level.
fn sync_log_level() {
    // SAFETY: sets an integer in the shim's logger.
    unsafe { lb_chat_set_log_verbosity(super::backend::common_log_verbosity()) };
}

/// Stack for the threads that run llama.cpp's Jinja and PEG parsers: both recurse once (or more)
/// per nesting level, and a worker's default 2 MiB overflows at a few hundred levels. Reserved
/// address space, committed only as far as it is used.
const PARSER_STACK: usize = 256 << 20;

/// Runs `f` on a short-lived thread with [`PARSER_STACK`] (the caller blocks until it is done).
fn on_parser_stack<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T> {
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("llama-branch-chat".into())
            .stack_size(PARSER_STACK)
            .spawn_scoped(scope, f)
            .map_err(|e| Error::Internal(format!("cannot start the chat thread: {e}")))?;
        handle
            .join()
            .map_err(|_| Error::Internal("the chat thread panicked".into()))
    })
}

/// Takes ownership of a shim string: copies it out and frees it.
fn take(p: *mut c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the shim returns a NUL-terminated malloc'd string that we own: copied, then
    // freed once with the shim's own free function.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    unsafe { lb_chat_free(p) };
    s
}

fn c_string(value: &str, what: &str) -> Result<CString> {
    CString::new(value).map_err(|_| Error::invalid(format!("{what} must not contain NUL bytes")))
}

fn opt_c_string(value: &Option<String>, what: &str) -> Result<Option<CString>> {
    value.as_deref().map(|v| c_string(v, what)).transpose()
}

fn opt_ptr(value: &Option<CString>) -> *const c_char {
    value.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
}

fn status_error(status: c_int, message: String, what: &str) -> Error {
    match status {
        LB_INVALID_INPUT => Error::invalid(format!("{what}: {message}")),
        LB_TEMPLATE => Error::ChatTemplate(message),
        LB_PARSE => Error::ChatParse(message),
        _ => Error::Internal(format!("{what}: {message}")),
    }
}

/// Inputs of `formatChat`, already type-checked.
#[derive(Default, Debug, Clone)]
pub struct FormatRequest {
    pub messages_json: String,
    pub template_override: Option<String>,
    pub tools_json: Option<String>,
    pub tool_choice: Option<String>,
    pub reasoning_format: Option<String>,
    pub json_schema: Option<String>,
    pub grammar: Option<String>,
    pub parallel_tool_calls: bool,
    pub enable_thinking: bool,
    pub add_generation_prompt: bool,
}

/// Renders the chat with the model's template (or the override); returns the result as JSON text.
pub fn format_chat(model: &Model, req: &FormatRequest) -> Result<String> {
    let messages = c_string(&req.messages_json, "messages")?;
    let template_override = opt_c_string(&req.template_override, "templateOverride")?;
    let tools = opt_c_string(&req.tools_json, "tools")?;
    let tool_choice = opt_c_string(&req.tool_choice, "toolChoice")?;
    let reasoning = opt_c_string(&req.reasoning_format, "reasoningFormat")?;
    let schema = opt_c_string(&req.json_schema, "jsonSchema")?;
    let grammar = opt_c_string(&req.grammar, "grammar")?;
    let args = FormatArgs {
        messages_json: messages.as_ptr(),
        template_override: opt_ptr(&template_override),
        tools_json: opt_ptr(&tools),
        tool_choice: opt_ptr(&tool_choice),
        reasoning_format: opt_ptr(&reasoning),
        json_schema: opt_ptr(&schema),
        grammar: opt_ptr(&grammar),
        parallel_tool_calls: req.parallel_tool_calls,
        enable_thinking: req.enable_thinking,
        add_generation_prompt: req.add_generation_prompt,
    };
    let model_ptr = SendPtr(model.as_ptr());
    let args_ptr = SendPtr(&args as *const FormatArgs as *mut FormatArgs);
    let (status, text) = on_parser_stack(move || {
        let (model_ptr, args_ptr) = (model_ptr, args_ptr);
        sync_log_level();
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: the model and every string `args` points to outlive this scoped thread; the
        // shim catches every C++ exception and reports it as a status and message.
        let status = unsafe { lb_chat_format(model_ptr.0, args_ptr.0, &mut out) };
        (status, take(out))
    })?;
    if status == LB_OK {
        Ok(text)
    } else {
        Err(status_error(status, text, "formatChat"))
    }
}

/// Inputs of `parseChatOutput`, already type-checked.
#[derive(Default, Debug, Clone)]
pub struct ParseRequest {
    pub output: String,
    pub format: i32,
    pub reasoning_format: i32,
    pub is_partial: bool,
    pub generation_prompt: Option<String>,
    pub parser: Option<String>,
}

/// Parses model output into `{content, reasoningContent, toolCalls}` (JSON text).
pub fn parse_chat_output(req: &ParseRequest) -> Result<String> {
    let output = c_string(&req.output, "output")?;
    let generation_prompt = opt_c_string(&req.generation_prompt, "generationPrompt")?;
    let parser = opt_c_string(&req.parser, "parser")?;
    let args = ParseArgs {
        output: output.as_ptr(),
        format: req.format,
        reasoning_format: req.reasoning_format,
        is_partial: req.is_partial,
        generation_prompt: opt_ptr(&generation_prompt),
        parser: opt_ptr(&parser),
    };
    let args_ptr = SendPtr(&args as *const ParseArgs as *mut ParseArgs);
    let (status, text) = on_parser_stack(move || {
        let args_ptr = args_ptr;
        sync_log_level();
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: as in `format_chat`.
        let status = unsafe { lb_chat_parse(args_ptr.0, &mut out) };
        (status, take(out))
    })?;
    if status == LB_OK {
        Ok(text)
    } else {
        Err(status_error(status, text, "parseChatOutput"))
    }
}

/// Whether a Jinja chat template parses and renders a one-message chat; `Err` carries the reason.
pub fn verify_template(template_src: &str) -> std::result::Result<(), String> {
    let src =
        CString::new(template_src).map_err(|_| "the template contains NUL bytes".to_string())?;
    let src_ptr = SendPtr(src.as_ptr() as *mut c_char);
    let (ok, reason) = on_parser_stack(move || {
        let src_ptr = src_ptr;
        sync_log_level();
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: as in `format_chat`.
        let ok = unsafe { lb_chat_verify_template(src_ptr.0, &mut out) };
        (ok, take(out))
    })
    .map_err(|e| e.to_string())?;
    if ok == 1 {
        Ok(())
    } else {
        Err(reason)
    }
}

/// The text the model's template puts between an assistant message's content and the next user
/// message's content.
pub fn turn_text(model: &Model, template: Option<&str>) -> Result<String> {
    let a = c_string("LBSENTINELASSISTANT7f3c", "sentinel")?;
    let b = c_string("LBSENTINELUSER9d2e", "sentinel")?;
    let template = opt_c_string(&template.map(str::to_string), "chatTemplate")?;
    let ptrs = (
        SendPtr(model.as_ptr()),
        SendPtr(opt_ptr(&template) as *mut c_char),
        SendPtr(a.as_ptr() as *mut c_char),
        SendPtr(b.as_ptr() as *mut c_char),
    );
    let (status, text) = on_parser_stack(move || {
        let (model_ptr, template_ptr, a_ptr, b_ptr) = ptrs;
        sync_log_level();
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: as in `format_chat`; the template (or null) outlives the call.
        let status =
            unsafe { lb_chat_turn_text(model_ptr.0, template_ptr.0, a_ptr.0, b_ptr.0, &mut out) };
        (status, take(out))
    })?;
    if status == LB_OK {
        Ok(text)
    } else {
        Err(status_error(status, text, "getTurnSeparator"))
    }
}

/// llama.cpp's chat format names, indexed by the format number `formatChat` reports.
pub fn format_names() -> Result<Vec<String>> {
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: the shim catches every exception and hands back a malloc'd string we own.
    let status = unsafe { lb_chat_format_names(&mut out) };
    let text = take(out);
    if status != LB_OK {
        return Err(Error::Internal(format!("chat format names: {text}")));
    }
    Ok(text.lines().map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_names_start_with_content_only() {
        let names = format_names().unwrap();
        assert!(names.len() >= 2);
        assert_eq!(names[0], "Content-only");
    }

    #[test]
    fn verify_template_accepts_jinja_and_reports_why_not() {
        assert!(verify_template(
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        )
        .is_ok());
        let reason = verify_template("{{ unclosed").unwrap_err();
        assert!(!reason.is_empty());
        assert_eq!(verify_template("").unwrap_err(), "the template is empty");
        assert!(verify_template("a\0b").is_err());
    }

    #[test]
    fn parse_without_a_parser_is_all_content() {
        let req = ParseRequest {
            output: "Hello \"world\"\n".into(),
            ..ParseRequest::default()
        };
        let json = parse_chat_output(&req).unwrap();
        assert_eq!(
            json,
            r#"{"content":"Hello \"world\"\n","reasoningContent":"","toolCalls":[]}"#
        );
    }

    #[test]
    fn parse_rejects_unknown_formats_and_parsers() {
        let bad_format = ParseRequest {
            format: 99,
            ..ParseRequest::default()
        };
        assert_eq!(
            parse_chat_output(&bad_format).unwrap_err().code(),
            "ERR_INVALID_ARG"
        );
        let bad_reasoning = ParseRequest {
            reasoning_format: 4,
            ..ParseRequest::default()
        };
        assert_eq!(
            parse_chat_output(&bad_reasoning).unwrap_err().code(),
            "ERR_INVALID_ARG"
        );
        let bad_parser = ParseRequest {
            parser: Some("{not json".into()),
            ..ParseRequest::default()
        };
        assert_eq!(
            parse_chat_output(&bad_parser).unwrap_err().code(),
            "ERR_INVALID_ARG"
        );
    }
}
