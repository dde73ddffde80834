// The addon's only C++: a C ABI over llama.cpp's chat layer (common/chat.h), which renders a
// model's Jinja chat template and parses model output (reasoning, tool calls) back.
//
// Rules of this file: no C++ exception ever crosses into Rust (every entry point catches
// everything and reports a status plus a message); results are malloc'd strings the caller frees
// with lb_chat_free; structured results are JSON text.

#include "chat.h"
#include "common.h"
#include "json.h"
#include "json-schema-to-grammar.h"
#include "log.h"
#include "llama.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

// Status codes, mirrored in src/ffi.rs.
constexpr int LB_OK = 0;
constexpr int LB_INVALID_INPUT = 1;  // messages/tools/options are not what the API takes
constexpr int LB_TEMPLATE = 2;       // the chat template failed to parse or render
constexpr int LB_PARSE = 3;          // model output does not match the chat format
constexpr int LB_INTERNAL = 4;

// Input problems found before the template runs (bad JSON, unknown toolChoice, ...).
struct input_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

char * dup_string(const std::string & s) {
    char * p = static_cast<char *>(std::malloc(s.size() + 1));
    if (p) {
        std::memcpy(p, s.data(), s.size());
        p[s.size()] = '\0';
    }
    return p;
}

int fail(char ** out, int status, const std::string & message) {
    *out = dup_string(message);
    return status;
}

std::string str_or_empty(const char * s) {
    return s ? std::string(s) : std::string();
}

common_json parse_json_input(const std::string & text, const char * what) {
    try {
        return common_json::parse(text);
    } catch (const std::exception & e) {
        throw input_error(std::string(what) + " is not valid JSON: " + e.what());
    }
}

common_reasoning_format reasoning_from_name(std::string name) {
    for (auto & c : name) {
        if (c == '_') {
            c = '-';
        }
    }
    try {
        return common_reasoning_format_from_name(name);
    } catch (const std::exception &) {
        throw input_error("reasoningFormat must be \"none\", \"auto\", \"deepseek\" or \"deepseek_legacy\", got \"" +
                          name + "\"");
    }
}

// True when the generation prompt leaves a reasoning block open (the model starts inside it).
bool thinking_forced_open(const common_chat_params & p) {
    if (!p.supports_thinking || p.thinking_start_tag.empty()) {
        return false;
    }
    const auto open = p.generation_prompt.rfind(p.thinking_start_tag);
    if (open == std::string::npos) {
        return false;
    }
    for (const auto & end : p.thinking_end_tags) {
        const auto close = p.generation_prompt.rfind(end);
        if (!end.empty() && close != std::string::npos && close > open) {
            return false;
        }
    }
    return true;
}

// Gemma's chat format (Google's template for Gemma 3, text parts only). Used for models whose GGUF
// carries no chat template but whose vocabulary has Gemma's turn tokens, where llama.cpp's own
// fallback (ChatML) would spell turns with markers the vocabulary does not know.
const char * GEMMA_TEMPLATE = R"TMPL({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
)TMPL";

bool is_single_token(const llama_vocab * vocab, const char * text) {
    const auto ids = common_tokenize(vocab, text, false, true);
    return ids.size() == 1;
}

// The template source to use when the caller gave none and the model has none ("" = llama.cpp's
// default).
std::string fallback_template(const llama_model * model) {
    if (!model || llama_model_chat_template(model, nullptr) || llama_model_chat_template(model, "tool_use")) {
        return "";
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    if (is_single_token(vocab, "<start_of_turn>") && is_single_token(vocab, "<end_of_turn>")) {
        return GEMMA_TEMPLATE;
    }
    return "";
}

// llama.cpp's Jinja parser and runtime recurse per nesting level without a limit, so a template
// nested absurdly deep would overflow the stack (a crash, not an exception). Real templates nest
// a few levels; refuse anything past MAX_NESTING brackets + blocks. (The caller also runs this
// on a thread with a large stack.)
constexpr int MAX_NESTING = 256;

void check_nesting(const std::string & src) {
    static const char * openers[] = { "if", "for", "macro", "call", "filter", "raw", "generation" };
    int depth = 0;
    for (size_t i = 0; i < src.size(); ++i) {
        const char c = src[i];
        if (c == '(' || c == '[' || c == '{') {
            ++depth;
        } else if (c == ')' || c == ']' || c == '}') {
            depth = depth > 0 ? depth - 1 : 0;
        } else if (c == '%' && i > 0 && src[i - 1] == '{') {
            size_t j = i + 1;
            while (j < src.size() && (src[j] == '-' || src[j] == '+' || std::isspace(static_cast<unsigned char>(src[j])))) {
                ++j;
            }
            size_t k = j;
            while (k < src.size() && std::isalpha(static_cast<unsigned char>(src[k]))) {
                ++k;
            }
            const std::string keyword = src.substr(j, k - j);
            if (keyword.rfind("end", 0) == 0) {
                depth = depth > 0 ? depth - 1 : 0;
            } else {
                for (const char * o : openers) {
                    if (keyword == o) {
                        ++depth;
                        break;
                    }
                }
            }
        }
        if (depth > MAX_NESTING) {
            throw std::invalid_argument("the chat template nests deeper than " + std::to_string(MAX_NESTING) +
                                        " levels (brackets and blocks)");
        }
    }
}

common_chat_templates_ptr init_templates(const llama_model * model, std::string override_src) {
    if (override_src.empty()) {
        override_src = fallback_template(model);
    }
    if (!override_src.empty()) {
        check_nesting(override_src);
    } else if (model) {
        for (const char * name : { static_cast<const char *>(nullptr), "tool_use" }) {
            if (const char * src = llama_model_chat_template(model, name)) {
                check_nesting(src);
            }
        }
    }
    try {
        return common_chat_templates_init(model, override_src);
    } catch (const std::exception & e) {
        throw std::invalid_argument(std::string("the chat template could not be parsed: ") + e.what());
    }
}

// The rest of the messages (after the leading empty system message) rendered exactly as they
// appear after an earlier user/assistant exchange: render(exchange + rest) minus
// render(exchange). Empty when the template does not render that way (then the caller falls
// back to strip_lone_system).
std::string render_after_exchange(const common_chat_templates * templates, const common_chat_templates_inputs & inputs) {
    try {
        common_chat_msg user;
        user.role    = "user";
        user.content = "LBEXCHANGEUSER";
        common_chat_msg assistant;
        assistant.role    = "assistant";
        assistant.content = "LBEXCHANGEASSISTANT";

        auto head_inputs                  = inputs;
        head_inputs.messages              = { user, assistant };
        head_inputs.add_generation_prompt = false;
        auto full_inputs                  = inputs;
        full_inputs.messages              = { user, assistant };
        full_inputs.messages.insert(full_inputs.messages.end(), inputs.messages.begin() + 1, inputs.messages.end());

        const std::string head = common_chat_templates_apply(templates, head_inputs).prompt;
        const std::string full = common_chat_templates_apply(templates, full_inputs).prompt;
        if (head.empty() || full.size() <= head.size() || full.compare(0, head.size(), head) != 0) {
            return "";
        }
        return full.substr(head.size());
    } catch (const std::exception &) {
        return "";
    }
}

// The older rule: drop what the empty system message alone renders to (e.g. a ChatML system
// header, or a default system prompt) when the prompt starts with it.
void strip_lone_system(const common_chat_templates * templates, const common_chat_msg & system, std::string & prompt) {
    common_chat_templates_inputs lone;
    lone.messages              = { system };
    lone.add_generation_prompt = false;
    lone.use_jinja             = true;
    std::string rendered;
    try {
        rendered = common_chat_templates_apply(templates, lone).prompt;
    } catch (const std::exception &) {
        return;  // templates that insist on a user message: nothing to strip
    }
    if (!rendered.empty() && prompt.compare(0, rendered.size(), rendered) == 0) {
        prompt.erase(0, rendered.size());
    }
}

// ---- Generic JSON tool calls ------------------------------------------------------------------
// llama.cpp's chat layer calls tools only through templates that render them; with any other
// template (Gemma 3's, plain ChatML) it leaves `tools` out of the prompt and builds no grammar.
// For those this shim uses ONE model-independent format: the tools are described in the system
// message, and the reply is one JSON object, {"tool_calls": [{"name", "arguments"}, ...]} or
// {"response": "..."}, forced by a grammar built from the tools' own parameter schemas and
// parsed back by lb_chat_parse. Its format number is one past llama.cpp's.
constexpr int LB_FORMAT_GENERIC = COMMON_CHAT_FORMAT_COUNT;

bool template_calls_tools(const common_chat_templates * templates) {
    const auto caps = common_chat_templates_get_caps(templates);
    const auto it   = caps.find("supports_tool_calls");
    return it != caps.end() && it->second;
}

bool history_has_tool_turns(const common_json & messages) {
    for (const auto & m : messages) {
        if (!m.is_object() || !m.contains("role") || !m.at("role").is_string()) {
            continue;
        }
        if (m.at("role").get<std::string>() == "tool" || (m.contains("tool_calls") && !m.at("tool_calls").is_null())) {
            return true;
        }
    }
    return false;
}

// A message's content as plain text (text parts joined; null is "").
std::string content_text(const common_json & message) {
    if (!message.contains("content") || message.at("content").is_null()) {
        return "";
    }
    const auto & content = message.at("content");
    if (content.is_string()) {
        return content.get<std::string>();
    }
    std::string text;
    if (content.is_array()) {
        for (const auto & part : content) {
            if (part.is_object() && part.contains("text") && part.at("text").is_string()) {
                text += part.at("text").get<std::string>();
            }
        }
    }
    return text;
}

// The JSON schema a generic reply must match.
common_json generic_reply_schema(const common_json & tools, common_chat_tool_choice choice, bool parallel) {
    auto calls = common_json::array();
    for (const auto & tool : tools) {
        const auto & function = tool.at("function");
        auto name             = common_json::object();
        name["type"]          = "string";
        name["const"]         = function.at("name");
        auto properties       = common_json::object();
        properties["name"]    = name;
        properties["arguments"] = common_chat_tool_parameters(function);
        auto call             = common_json::object();
        call["type"]          = "object";
        call["properties"]    = properties;
        call["required"]      = common_json::array({ "name", "arguments" });
        calls.push_back(call);
    }
    auto items = common_json::object();
    if (calls.size() == 1) {
        items = calls[0];
    } else {
        items["anyOf"] = calls;
    }
    auto list          = common_json::object();
    list["type"]       = "array";
    list["items"]      = items;
    list["minItems"]   = 1;
    if (!parallel) {
        list["maxItems"] = 1;
    }
    auto call_props          = common_json::object();
    call_props["tool_calls"] = list;
    auto call_reply          = common_json::object();
    call_reply["type"]       = "object";
    call_reply["properties"] = call_props;
    call_reply["required"]   = common_json::array({ "tool_calls" });
    if (choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED) {
        return call_reply;
    }
    auto text                  = common_json::object();
    text["type"]               = "string";
    auto text_props            = common_json::object();
    text_props["response"]     = text;
    auto text_reply            = common_json::object();
    text_reply["type"]         = "object";
    text_reply["properties"]   = text_props;
    text_reply["required"]     = common_json::array({ "response" });
    auto reply                 = common_json::object();
    reply["anyOf"]             = common_json::array({ call_reply, text_reply });
    return reply;
}

std::string generic_system_text(const common_json & tools, common_chat_tool_choice choice) {
    std::string text = choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED
                           ? "You must call one of the tools below. Reply with one JSON object and nothing else: "
                             "{\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}]}."
                           : "You can call the tools below. Reply with one JSON object and nothing else: either "
                             "{\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}]} to "
                             "call tools, or {\"response\": <your answer as a string>} to answer directly.";
    auto described = common_json::array();
    for (const auto & tool : tools) {
        described.push_back(tool.at("function"));
    }
    return text + "\n\nTools:\n" + described.dump(2);
}

// The messages rewritten for a template without tools: earlier calls and answers become JSON in
// the generic reply format, tool results become user turns (merged with their neighbours, for
// templates that insist on alternating roles), and the tool description leads the system message.
common_json generic_messages(const common_json & messages, const std::string & system_text) {
    auto out = common_json::array();
    auto push = [&](const std::string & role, const std::string & content) {
        if (out.size() > 0 && role == "user" && out.back().at("role").get<std::string>() == "user") {
            out.back()["content"] = out.back().at("content").get<std::string>() + "\n" + content;
            return;
        }
        auto m       = common_json::object();
        m["role"]    = role;
        m["content"] = content;
        out.push_back(m);
    };
    for (size_t i = 0; i < messages.size(); i++) {
        const auto & m = messages.at(i);
        if (!m.is_object() || !m.contains("role") || !m.at("role").is_string()) {
            throw input_error("messages[" + std::to_string(i) + "] must be an object with a role");
        }
        const std::string role = m.at("role").get<std::string>();
        if (role == "tool") {
            auto answer        = common_json::object();
            answer["tool_call_id"] = m.value("tool_call_id", std::string());
            answer["content"]  = content_text(m);
            auto wrapped       = common_json::object();
            wrapped["tool_response"] = answer;
            push("user", wrapped.dump());
        } else if (role == "assistant") {
            auto reply = common_json::object();
            if (m.contains("tool_calls") && m.at("tool_calls").is_array() && m.at("tool_calls").size() > 0) {
                auto calls = common_json::array();
                for (const auto & c : m.at("tool_calls")) {
                    const auto & fn = c.at("function");
                    auto call       = common_json::object();
                    call["name"]    = fn.at("name");
                    const auto & args = fn.contains("arguments") ? fn.at("arguments") : common_json::object();
                    call["arguments"] = args.is_string() ? common_json::parse(args.get<std::string>()) : args;
                    calls.push_back(call);
                }
                reply["tool_calls"] = calls;
            } else {
                reply["response"] = content_text(m);
            }
            push("assistant", reply.dump());
        } else {
            push(role, content_text(m));
        }
    }
    if (!system_text.empty()) {
        if (out.size() > 0 && out.at(0).at("role").get<std::string>() == "system") {
            const std::string rest = out.at(0).at("content").get<std::string>();
            out[0]["content"]      = rest.empty() ? system_text : rest + "\n\n" + system_text;
        } else {
            auto system       = common_json::object();
            system["role"]    = "system";
            system["content"] = system_text;
            auto with = common_json::array();
            with.push_back(system);
            for (const auto & m : out) {
                with.push_back(m);
            }
            out = with;
        }
    }
    return out;
}

// Stands in a healed partial reply for what has not arrived yet (see heal_partial_json).
const std::string PARTIAL_MARK = "__llama_branch_partial__";

// A prefix of a JSON document (a reply still streaming) made into one that parses: an open
// string value ends with PARTIAL_MARK; otherwise the text is cut back to where a value could
// end and PARTIAL_MARK goes in as one more key (objects) or element (arrays); then every open
// container is closed. What a value dumps to, cut at the mark, is then a prefix of what it dumps
// to once complete, so streamed pieces concatenate to the final text. "" when nothing opened yet.
std::string heal_partial_json(const std::string & text) {
    struct Open {
        char kind;       // '{' or '['
        bool has_items;  // a complete member or element is in it
        bool want_key;   // (objects) the next string is a key
    };
    std::vector<Open> open;
    // The last place the text may be cut: text[0, cut_end) is kept, then the containers open
    // there ('{' or '[', outermost first) close; cut_has_items: the innermost holds a member.
    bool        have_cut = false, cut_has_items = false;
    size_t      cut_end  = 0;
    std::string cut_kinds;
    auto        mark_cut = [&](size_t end) {
        have_cut      = true;
        cut_end       = end;
        cut_has_items = open.back().has_items;
        cut_kinds.clear();
        for (const Open & o : open) {
            cut_kinds += o.kind;
        }
    };
    bool   in_string = false, string_is_value = false, escaped = false;
    size_t string_safe = 0;  // in a string: text up to here holds whole characters and escapes
    size_t i = 0;
    auto   value_done = [&](size_t end) {
        if (!open.empty()) {
            open.back().has_items = true;
            mark_cut(end);
        }
    };
    for (; i < text.size(); i++) {
        const char c = text[i];
        if (in_string) {
            if (escaped) {
                escaped = false;
                if (c == 'u') {
                    if (i + 4 >= text.size()) {
                        break;  // an escape still arriving
                    }
                    i += 4;
                }
                string_safe = i + 1;
            } else if (c == '\\') {
                escaped = true;
            } else if (c == '"') {
                in_string = false;
                if (string_is_value) {
                    value_done(i + 1);
                } else if (!open.empty()) {
                    open.back().want_key = false;
                }
            } else if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) {
                // the start of a character: a multi-byte one is whole once its last byte is in
                const unsigned char u   = static_cast<unsigned char>(c);
                const size_t        len = u < 0x80 ? 1 : u >= 0xF0 ? 4 : u >= 0xE0 ? 3 : 2;
                if (i + len <= text.size()) {
                    string_safe = i + len;
                }
            }
            continue;
        }
        switch (c) {
            case '"':
                in_string       = true;
                string_is_value = !(open.size() > 0 && open.back().kind == '{' && open.back().want_key);
                string_safe     = i + 1;
                break;
            case '{':
            case '[':
                open.push_back(Open{ c, false, c == '{' });
                mark_cut(i + 1);
                break;
            case '}':
            case ']':
                if (open.empty()) {
                    return "";
                }
                open.pop_back();
                value_done(i + 1);
                break;
            case ',':
                if (!open.empty() && open.back().kind == '{') {
                    open.back().want_key = true;
                }
                break;
            default:
                // a number or literal ends at the delimiter after it: nothing to cut at before
                if (c != ':' && !std::isspace(static_cast<unsigned char>(c))) {
                    size_t end = i;
                    while (end < text.size() && std::string("{}[],: \t\r\n").find(text[end]) == std::string::npos) {
                        end++;
                    }
                    if (end == text.size()) {
                        i = end;  // still arriving
                        break;
                    }
                    value_done(end);
                    i = end - 1;
                }
        }
    }
    std::string healed, closing;
    if (in_string && string_is_value) {
        healed = text.substr(0, string_safe) + PARTIAL_MARK + "\"";
        for (const Open & o : open) {
            closing += o.kind;
        }
    } else if (have_cut) {
        healed  = text.substr(0, cut_end);
        closing = cut_kinds;
        healed += cut_has_items ? "," : "";
        healed += "\"" + PARTIAL_MARK + "\"" + (closing.back() == '{' ? ":0" : "");
    } else {
        return "";
    }
    for (auto it = closing.rbegin(); it != closing.rend(); ++it) {
        healed += *it == '{' ? '}' : ']';
    }
    return healed;
}

// `dumped` up to PARTIAL_MARK (and the quote or comma before it): the part that has arrived.
std::string cut_at_mark(const std::string & dumped) {
    const size_t mark = dumped.find(PARTIAL_MARK);
    if (mark == std::string::npos) {
        return dumped;
    }
    size_t end = mark;
    if (end > 0 && dumped[end - 1] == '"' && (end < 2 || dumped[end - 2] == ',' || dumped[end - 2] == '{' ||
                                              dumped[end - 2] == '[')) {
        end--;  // the mark is a key or element of its own, not the tail of a string value
        if (end > 0 && dumped[end - 1] == ',') {
            end--;
        }
    }
    return dumped.substr(0, end);
}

// A generic reply parsed: {"response": ...} is content, {"tool_calls": [...]} the calls. Output
// that is not such an object (cut off by maxTokens, or the grammar was not applied) is content.
// Partial output (streaming) gives what has arrived: the response so far, each call once its
// name is whole, its arguments as far as they have come ("" before they start).
common_chat_msg parse_generic(const std::string & output, bool is_partial) {
    common_chat_msg msg;
    auto reply = common_json::parse_no_throw(output);
    if (is_partial && (reply.is_discarded() || !reply.is_object())) {
        const std::string healed = heal_partial_json(output);
        reply = healed.empty() ? common_json::parse_no_throw("null") : common_json::parse_no_throw(healed);
    }
    if (reply.is_discarded() || !reply.is_object()) {
        msg.content = is_partial ? "" : output;
        return msg;
    }
    if (reply.contains("response") && reply.at("response").is_string()) {
        msg.content = cut_at_mark(reply.at("response").get<std::string>());
    }
    if (reply.contains("tool_calls") && reply.at("tool_calls").is_array()) {
        for (const auto & c : reply.at("tool_calls")) {
            if (!c.is_object() || !c.contains("name") || !c.at("name").is_string()) {
                break;
            }
            common_chat_tool_call call;
            call.name = c.at("name").get<std::string>();
            if (call.name.find(PARTIAL_MARK) != std::string::npos) {
                break;  // the name is still arriving
            }
            if (c.contains("arguments")) {
                call.arguments = cut_at_mark(c.at("arguments").dump());
            } else {
                call.arguments = is_partial ? "" : "{}";
            }
            msg.tool_calls.push_back(call);
        }
    }
    return msg;
}

}  // namespace

extern "C" {

struct lb_chat_format_args {
    const char * messages_json;      // JSON array of {role, content, ...} (OpenAI style)
    const char * template_override;  // NULL/empty: the model's own template
    const char * tools_json;         // NULL: no tools
    const char * tool_choice;        // NULL: "auto"
    const char * reasoning_format;   // NULL: "none"
    const char * json_schema;        // NULL: none
    const char * grammar;            // NULL: none
    bool         parallel_tool_calls;
    bool         enable_thinking;
    bool         add_generation_prompt;
};

struct lb_chat_parse_args {
    const char * output;
    int          format;
    int          reasoning_format;
    bool         is_partial;
    const char * generation_prompt;  // NULL: none
    const char * parser;             // NULL/empty: content only
};

void lb_chat_free(char * p) {
    std::free(p);
}

// llama.cpp's common layer logs through its own logger (not llama_log_set); this keeps it at the
// addon's level. `verbosity` is common's scale: -1 silent, 1 error, 2 warn, 3 info, 5 debug.
void lb_chat_set_log_verbosity(int verbosity) {
    if (common_log_get_verbosity_thold() != verbosity) {
        common_log_set_verbosity_thold(verbosity);
    }
}

// Renders the messages with the chat template. On LB_OK *out is the result as JSON text.
int lb_chat_format(const llama_model * model, const lb_chat_format_args * args, char ** out) {
    *out = nullptr;
    try {
        common_chat_templates_inputs inputs;
        auto messages = parse_json_input(str_or_empty(args->messages_json), "messages");
        if (!messages.is_array()) {
            throw input_error("messages must be a JSON array of {role, content}");
        }
        common_json tools = common_json::array();
        if (args->tools_json) {
            tools = parse_json_input(args->tools_json, "tools");
            if (!tools.is_array()) {
                throw input_error("tools must be a JSON array of {type: 'function', function: {...}}");
            }
            try {
                inputs.tools = common_chat_tools_parse_oaicompat(tools);
            } catch (const std::exception & e) {
                throw input_error(std::string("tools: ") + e.what());
            }
        }
        if (args->tool_choice) {
            try {
                inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(args->tool_choice);
            } catch (const std::exception &) {
                throw input_error(std::string("toolChoice must be \"auto\", \"none\" or \"required\", got \"") +
                                  args->tool_choice + "\"");
            }
        }
        if (args->reasoning_format) {
            inputs.reasoning_format = reasoning_from_name(args->reasoning_format);
        }
        if (args->json_schema) {
            parse_json_input(args->json_schema, "jsonSchema");
            inputs.json_schema = args->json_schema;
        }
        inputs.grammar               = str_or_empty(args->grammar);
        inputs.parallel_tool_calls   = args->parallel_tool_calls;
        inputs.enable_thinking       = args->enable_thinking;
        inputs.add_generation_prompt = args->add_generation_prompt;
        inputs.use_jinja             = true;

        auto templates = init_templates(model, str_or_empty(args->template_override));

        // Templates that cannot render tools get the generic JSON format (see above).
        const bool generic =
            (!inputs.tools.empty() || history_has_tool_turns(messages)) && !template_calls_tools(templates.get());
        const bool generic_calls = generic && !inputs.tools.empty() && inputs.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
        std::string generic_grammar;
        if (generic) {
            if (generic_calls && (args->json_schema || !inputs.grammar.empty())) {
                throw input_error("give tools or a grammar / jsonSchema, not both");
            }
            // A leading empty system message (this turn only) keeps the description out: it was
            // sent with the conversation's first turn.
            const bool turn_only = messages.size() > 0 && messages.at(0).is_object() &&
                                   messages.at(0).contains("role") && messages.at(0).at("role").is_string() &&
                                   messages.at(0).at("role").get<std::string>() == "system" &&
                                   content_text(messages.at(0)).empty();
            try {
                messages = generic_messages(
                    messages, generic_calls && !turn_only ? generic_system_text(tools, inputs.tool_choice) : "");
            } catch (const input_error &) {
                throw;
            } catch (const std::exception & e) {
                throw input_error(std::string("messages: a tool call in the history is malformed: ") + e.what());
            }
            if (generic_calls) {
                generic_grammar =
                    json_schema_to_grammar(generic_reply_schema(tools, inputs.tool_choice, inputs.parallel_tool_calls));
            }
            inputs.tools.clear();  // the template would leave them out anyway
        }
        try {
            inputs.messages = common_chat_msgs_parse_oaicompat(messages);
        } catch (const std::exception & e) {
            throw input_error(std::string("messages: ") + e.what());
        }
        common_chat_params params;
        try {
            params = common_chat_templates_apply(templates.get(), inputs);
        } catch (const std::exception & e) {
            throw std::invalid_argument(std::string("the chat template failed to render: ") + e.what());
        }

        // A leading empty system message asks for "this turn only", to append to a conversation
        // already in the KV cache.
        const auto & msgs = inputs.messages;
        if (!msgs.empty() && msgs[0].role == "system" && msgs[0].empty()) {
            std::string turn = render_after_exchange(templates.get(), inputs);
            if (!turn.empty()) {
                params.prompt = std::move(turn);
            } else {
                strip_lone_system(templates.get(), msgs[0], params.prompt);
            }
        }
        if (params.prompt.empty()) {
            throw std::invalid_argument("the chat template rendered an empty prompt for these messages");
        }

        const llama_vocab * vocab = model ? llama_model_get_vocab(model) : nullptr;
        auto triggers = common_json::array();
        for (const auto & t : params.grammar_triggers) {
            llama_token token = t.token;
            if (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN && token == LLAMA_TOKEN_NULL && vocab) {
                const auto ids = common_tokenize(vocab, t.value, false, true);
                if (ids.size() == 1) {
                    token = ids[0];
                }
            }
            auto item     = common_json::object();
            item["type"]  = static_cast<int>(t.type);
            item["value"] = t.value;
            item["token"] = static_cast<int>(token);
            triggers.push_back(item);
        }
        auto result                  = common_json::object();
        result["prompt"]             = params.prompt;
        result["stopTokens"]         = params.additional_stops;
        result["format"]             = static_cast<int>(params.format);
        result["grammar"]            = params.grammar;
        result["grammarLazy"]        = params.grammar_lazy;
        result["thinkingForcedOpen"] = thinking_forced_open(params);
        result["supportsThinking"]   = params.supports_thinking;
        result["reasoningFormat"]    = static_cast<int>(inputs.reasoning_format);
        result["parser"]             = params.parser;
        result["generationPrompt"]   = params.generation_prompt;
        result["grammarTriggers"]    = triggers;
        result["preservedTokens"]    = params.preserved_tokens;
        if (generic_calls) {
            result["format"]      = LB_FORMAT_GENERIC;
            result["grammar"]     = generic_grammar;
            result["grammarLazy"] = false;
            result["parser"]      = "";
        }
        *out                         = dup_string(result.dump_safe());
        return *out ? LB_OK : LB_INTERNAL;
    } catch (const input_error & e) {
        return fail(out, LB_INVALID_INPUT, e.what());
    } catch (const std::exception & e) {
        return fail(out, LB_TEMPLATE, e.what());
    } catch (...) {
        return fail(out, LB_INTERNAL, "unknown C++ exception in formatChat");
    }
}

// Parses model output into {content, reasoningContent, toolCalls} (JSON text in *out).
int lb_chat_parse(const lb_chat_parse_args * args, char ** out) {
    *out = nullptr;
    try {
        if (args->format < 0 || args->format > LB_FORMAT_GENERIC) {
            return fail(out, LB_INVALID_INPUT,
                        "format must be a chat format number from formatChat() (0.." +
                            std::to_string(LB_FORMAT_GENERIC) + "), got " + std::to_string(args->format));
        }
        if (args->reasoning_format < COMMON_REASONING_FORMAT_NONE ||
            args->reasoning_format > COMMON_REASONING_FORMAT_DEEPSEEK) {
            return fail(out, LB_INVALID_INPUT,
                        "reasoningFormat must be 0..3 (none, auto, deepseek_legacy, deepseek), got " +
                            std::to_string(args->reasoning_format));
        }
        const bool generic = args->format == LB_FORMAT_GENERIC;
        common_chat_parser_params params;
        params.format            = generic ? COMMON_CHAT_FORMAT_CONTENT_ONLY : static_cast<common_chat_format>(args->format);
        params.reasoning_format  = static_cast<common_reasoning_format>(args->reasoning_format);
        const std::string parser = str_or_empty(args->parser);
        if (!parser.empty()) {
            // The generation prompt is the start of what a format's parser matches; the
            // content-only fallback parser would copy it into the content instead.
            params.generation_prompt = str_or_empty(args->generation_prompt);
            try {
                params.parser.load(parser);
            } catch (const std::exception & e) {
                return fail(out, LB_INVALID_INPUT,
                            std::string("parser is not a parser definition from formatChat(): ") + e.what());
            }
        }
        common_chat_msg msg;
        try {
            msg = generic ? parse_generic(str_or_empty(args->output), args->is_partial)
                          : common_chat_parse(str_or_empty(args->output), args->is_partial, params);
        } catch (const std::exception & e) {
            return fail(out, LB_PARSE, e.what());
        }
        auto calls = common_json::array();
        for (const auto & c : msg.tool_calls) {
            auto call         = common_json::object();
            call["name"]      = c.name;
            call["arguments"] = c.arguments;
            call["id"]        = c.id;
            calls.push_back(call);
        }
        auto result                = common_json::object();
        result["content"]          = msg.content;
        result["reasoningContent"] = msg.reasoning_content;
        result["toolCalls"]        = calls;
        *out                       = dup_string(result.dump_safe());
        return *out ? LB_OK : LB_INTERNAL;
    } catch (const std::exception & e) {
        return fail(out, LB_INTERNAL, e.what());
    } catch (...) {
        return fail(out, LB_INTERNAL, "unknown C++ exception in parseChatOutput");
    }
}

// 1 = the template parses and renders a one-message chat, 0 = it does not (*out says why).
int lb_chat_verify_template(const char * template_src, char ** out) {
    *out = nullptr;
    try {
        const std::string src = str_or_empty(template_src);
        if (src.empty()) {
            // common_chat_templates_init asserts on an empty override without a model.
            *out = dup_string("the template is empty");
            return 0;
        }
        check_nesting(src);
        common_chat_msg msg;
        msg.role    = "user";
        msg.content = "test";
        common_chat_templates_inputs inputs;
        inputs.messages  = { msg };
        inputs.use_jinja = true;
        auto templates   = common_chat_templates_init(nullptr, src);
        common_chat_templates_apply(templates.get(), inputs);
        return 1;
    } catch (const std::exception & e) {
        *out = dup_string(e.what());
        return 0;
    } catch (...) {
        *out = dup_string("unknown C++ exception");
        return 0;
    }
}

// The text the template puts between the end of an assistant message and the start of the next
// user message's content (*out), found by rendering two sentinels.
int lb_chat_turn_text(const llama_model * model, const char * template_override, const char * sentinel_a,
                      const char * sentinel_b, char ** out) {
    *out = nullptr;
    try {
        std::vector<common_chat_msg> msgs(3);
        msgs[0].role    = "user";
        msgs[0].content = "X";
        msgs[1].role    = "assistant";
        msgs[1].content = sentinel_a;
        msgs[2].role    = "user";
        msgs[2].content = sentinel_b;
        common_chat_templates_inputs inputs;
        inputs.messages              = msgs;
        inputs.add_generation_prompt = false;
        inputs.use_jinja             = true;
        auto templates               = init_templates(model, str_or_empty(template_override));
        const std::string prompt     = common_chat_templates_apply(templates.get(), inputs).prompt;
        const auto a                 = prompt.find(sentinel_a);
        const auto b                 = prompt.find(sentinel_b);
        if (a == std::string::npos || b == std::string::npos || b < a + std::strlen(sentinel_a)) {
            return fail(out, LB_TEMPLATE, "the chat template does not render both sentinel messages in order");
        }
        const auto start = a + std::strlen(sentinel_a);
        *out             = dup_string(prompt.substr(start, b - start));
        return *out ? LB_OK : LB_INTERNAL;
    } catch (const std::exception & e) {
        return fail(out, LB_TEMPLATE, e.what());
    } catch (...) {
        return fail(out, LB_INTERNAL, "unknown C++ exception in getTurnSeparator");
    }
}

// The names of llama.cpp's chat formats, one per line in enum order (the numbers formatChat
// reports and parseChatOutput takes).
int lb_chat_format_names(char ** out) {
    *out = nullptr;
    try {
        std::string names;
        for (int i = 0; i < COMMON_CHAT_FORMAT_COUNT; i++) {
            names += common_chat_format_name(static_cast<common_chat_format>(i));
            names += '\n';
        }
        names += "generic\n";  // LB_FORMAT_GENERIC: llama-branch's generic JSON tool calls
        *out = dup_string(names);
        return *out ? LB_OK : LB_INTERNAL;
    } catch (const std::exception & e) {
        return fail(out, LB_INTERNAL, e.what());
    } catch (...) {
        return fail(out, LB_INTERNAL, "unknown C++ exception in chat format names");
    }
}

}  // extern "C"
