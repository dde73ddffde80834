'use strict';

/**
 * The chat template the server renders with for a GGUF that carries none, as text, for routers
 * that render templates themselves (./hf-tokenizer.js puts it in tokenizer_config.json). It
 * must stay the one src/llama/chat_shim.cpp's `fallback_template` picks: Gemma's format when the
 * vocabulary has Gemma's turn tokens (GEMMA_TEMPLATE there, copied verbatim; test/grpc.test.js
 * checks that SMG's rendering through it gives the server's own prompt tokens), else
 * llama.cpp's ChatML.
 */

const GEMMA_TEMPLATE = `{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
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
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
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
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\\n' }}
{%- endif -%}
`;

/** llama.cpp's template when a model has none and is not Gemma-like (common_chat_templates_init's ChatML). */
const CHATML_TEMPLATE =
  "{%- for message in messages -%}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/** The template for a vocabulary (`tokens`, `types`: the GGUF's) whose GGUF has none. */
function fallbackTemplate(tokens, types) {
  const control = (text) => {
    const id = tokens.indexOf(text);
    return id >= 0 && types[id] === 3;
  };
  return control('<start_of_turn>') && control('<end_of_turn>') ? GEMMA_TEMPLATE : CHATML_TEMPLATE;
}

module.exports = { fallbackTemplate, GEMMA_TEMPLATE, CHATML_TEMPLATE };
