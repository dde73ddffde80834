'use strict';

/**
 * A GGUF model's tokenizer as Hugging Face files, for routers that tokenize themselves (SMG asks
 * a gRPC worker for them with `GetTokenizer`, ./grpc.js): `tokenizer.json` (the `tokenizers`
 * library's format) and `tokenizer_config.json` (special tokens and the chat template), zipped.
 *
 * Built from the GGUF's `tokenizer.ggml.*` metadata (./gguf-meta.js). Supported: SentencePiece
 * BPE vocabularies (`tokenizer.ggml.model` "llama": Gemma, Llama 2, Mistral), written as a BPE
 * model with byte fallback whose merges are ranked by the merged piece's score — the order in
 * which llama.cpp's SPM tokenizer merges adjacent symbols; control tokens (special) and
 * user-defined ones (matched whole before the model, as llama.cpp partitions them) are added
 * tokens. Other vocabularies (GPT-2-style byte-level BPE, WordPiece, ...) throw
 * ERR_TOKENIZER_UNSUPPORTED: give the router a tokenizer directory of the model instead.
 */

const zlib = require('node:zlib');
const { readGgufMeta } = require('./gguf-meta');
const { makeError } = require('../errors');
const { fallbackTemplate } = require('./fallback-templates');

/** The error codes of this module (their one definition; index.d.ts's ErrorCode lists them). */
const TokenizerErrorCode = Object.freeze({ UNSUPPORTED: 'ERR_TOKENIZER_UNSUPPORTED' });

const TOKEN_TYPE = { normal: 1, unknown: 2, control: 3, userDefined: 4, byte: 6 };
/** The GGUF's tokenizer metadata: `{ model, tokens, scores, types, bos, eos, unk, pad, addBos, addSpacePrefix, chatTemplate }`. */
function vocabOf(modelPath) {
  const m = readGgufMeta(modelPath, (k) => k.startsWith('tokenizer.'));
  const get = (k, fallback = null) => (m.has(k) ? m.get(k) : fallback);
  return {
    model: get('tokenizer.ggml.model'),
    tokens: get('tokenizer.ggml.tokens', []),
    scores: get('tokenizer.ggml.scores', []),
    types: get('tokenizer.ggml.token_type', []),
    bos: get('tokenizer.ggml.bos_token_id'),
    eos: get('tokenizer.ggml.eos_token_id'),
    unk: get('tokenizer.ggml.unknown_token_id'),
    pad: get('tokenizer.ggml.padding_token_id'),
    addBos: get('tokenizer.ggml.add_bos_token', true),
    addSpacePrefix: get('tokenizer.ggml.add_space_prefix', true),
    chatTemplate: get('tokenizer.chat_template'),
  };
}

const ID_KEYS = {
  bos: 'tokenizer.ggml.bos_token_id',
  eos: 'tokenizer.ggml.eos_token_id',
  pad: 'tokenizer.ggml.padding_token_id',
};

/** The GGUF's BOS, EOS and padding token ids (null where absent), without decoding its vocabulary. */
function specialIdsOf(modelPath) {
  const wanted = new Set(Object.values(ID_KEYS));
  const m = readGgufMeta(modelPath, (k) => wanted.has(k));
  const id = (key) => (m.has(key) ? m.get(key) : null);
  return { bos: id(ID_KEYS.bos), eos: id(ID_KEYS.eos), pad: id(ID_KEYS.pad) };
}

/**
 * BPE merges equivalent to SentencePiece's score-driven merging: for every normal piece, each
 * split into two pieces of the vocabulary is a merge, ranked by the whole piece's score (highest
 * first), then by the pieces' ids.
 */
function spmMerges(v, ids) {
  const merges = [];
  for (let id = 0; id < v.tokens.length; id++) {
    if (v.types[id] !== TOKEN_TYPE.normal) continue;
    const chars = [...v.tokens[id]];
    for (let k = 1; k < chars.length; k++) {
      const left = chars.slice(0, k).join('');
      const right = chars.slice(k).join('');
      const l = ids.get(left);
      const r = ids.get(right);
      if (l !== undefined && r !== undefined) merges.push({ score: v.scores[id] ?? 0, id, l, r, left, right });
    }
  }
  merges.sort((a, b) => b.score - a.score || a.id - b.id || a.l - b.l);
  return merges.map((x) => [x.left, x.right]);
}

/** `tokenizer.json` of a SentencePiece BPE vocabulary. */
function spmTokenizerJson(v) {
  const ids = new Map();
  v.tokens.forEach((t, id) => ids.has(t) || ids.set(t, id));
  const added = [];
  v.tokens.forEach((content, id) => {
    const type = v.types[id];
    if (type === TOKEN_TYPE.control || type === TOKEN_TYPE.userDefined || type === TOKEN_TYPE.unknown)
      added.push({
        id,
        content,
        single_word: false,
        lstrip: false,
        rstrip: false,
        normalized: false,
        special: type !== TOKEN_TYPE.userDefined,
      });
  });
  const space = { type: 'Replace', pattern: { String: ' ' }, content: '▁' };
  const bos = v.bos === null ? null : v.tokens[v.bos];
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: v.addSpacePrefix
      ? { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' }, space] }
      : space,
    pre_tokenizer: null,
    post_processor: v.addBos && bos !== null ? bosProcessor(bos, v.bos) : null,
    decoder: {
      type: 'Sequence',
      decoders: [
        { type: 'Replace', pattern: { String: '▁' }, content: ' ' },
        { type: 'ByteFallback' },
        { type: 'Fuse' },
        ...(v.addSpacePrefix ? [{ type: 'Strip', content: ' ', start: 1, stop: 0 }] : []),
      ],
    },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: v.unk === null ? null : v.tokens[v.unk],
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: true,
      ignore_merges: false,
      vocab: Object.fromEntries(ids),
      merges: spmMerges(v, ids),
    },
  };
}

/** The post-processor that puts BOS before every sequence (the GGUF's add_bos_token). */
function bosProcessor(bos, bosId) {
  const seq = (id) => ({ Sequence: { id, type_id: 0 } });
  const special = { SpecialToken: { id: bos, type_id: 0 } };
  return {
    type: 'TemplateProcessing',
    single: [special, seq('A')],
    pair: [special, seq('A'), special, seq('B')],
    special_tokens: { [bos]: { id: bos, ids: [bosId], tokens: [bos] } },
  };
}

/**
 * The model's tokenizer files: `{ 'tokenizer.json': text, 'tokenizer_config.json': text }`.
 * `chatTemplate`: the template the server renders with (its `--chat-template-file`), else the
 * GGUF's, else llama.cpp's ChatML fallback — the one the server itself uses then.
 * @param {string} modelPath @param {{ chatTemplate?: string, maxLength?: number }} [options]
 */
function hfTokenizerFiles(modelPath, { chatTemplate, maxLength } = {}) {
  const v = vocabOf(modelPath);
  if (v.model !== 'llama')
    throw makeError(
      TokenizerErrorCode.UNSUPPORTED,
      `cannot write a Hugging Face tokenizer for a "${v.model}" vocabulary (only SentencePiece, "llama"): give the router the model's tokenizer directory (smg --tokenizer-path)`,
    );
  const name = (id) => (id === null || id === undefined ? null : v.tokens[id]);
  const config = {
    tokenizer_class: 'PreTrainedTokenizerFast',
    add_bos_token: Boolean(v.addBos),
    add_eos_token: false,
    bos_token: name(v.bos),
    eos_token: name(v.eos),
    unk_token: name(v.unk),
    pad_token: name(v.pad),
    clean_up_tokenization_spaces: false,
    ...(maxLength ? { model_max_length: maxLength } : {}),
    chat_template: chatTemplate || v.chatTemplate || fallbackTemplate(v.tokens, v.types),
  };
  return {
    'tokenizer.json': JSON.stringify(spmTokenizerJson(v)),
    'tokenizer_config.json': JSON.stringify(config, null, 2),
  };
}

/** A zip archive (deflated entries, no folders) of `files` (name → text). */
function zipFiles(files) {
  const locals = [];
  const centrals = [];
  let offset = 0;
  for (const [name, text] of Object.entries(files)) {
    const data = Buffer.from(text, 'utf8');
    const packed = zlib.deflateRawSync(data);
    const nameBytes = Buffer.from(name, 'utf8');
    const crc = zlib.crc32(data);
    const local = Buffer.alloc(30);
    local.writeUInt32LE(0x04034b50, 0);
    local.writeUInt16LE(20, 4); // version needed
    local.writeUInt16LE(0x0800, 6); // UTF-8 names
    local.writeUInt16LE(8, 8); // deflate
    local.writeUInt16LE(0x21, 12); // 1980-01-01
    local.writeUInt32LE(crc, 14);
    local.writeUInt32LE(packed.length, 18);
    local.writeUInt32LE(data.length, 22);
    local.writeUInt16LE(nameBytes.length, 26);
    const central = Buffer.alloc(46);
    central.writeUInt32LE(0x02014b50, 0);
    central.writeUInt16LE(20, 4);
    central.writeUInt16LE(20, 6);
    central.writeUInt16LE(0x0800, 8);
    central.writeUInt16LE(8, 10);
    central.writeUInt16LE(0x21, 14);
    central.writeUInt32LE(crc, 16);
    central.writeUInt32LE(packed.length, 20);
    central.writeUInt32LE(data.length, 24);
    central.writeUInt16LE(nameBytes.length, 28);
    central.writeUInt32LE(offset, 42);
    locals.push(local, nameBytes, packed);
    centrals.push(central, nameBytes);
    offset += local.length + nameBytes.length + packed.length;
  }
  const directory = Buffer.concat(centrals);
  const end = Buffer.alloc(22);
  end.writeUInt32LE(0x06054b50, 0);
  end.writeUInt16LE(centrals.length / 2, 8);
  end.writeUInt16LE(centrals.length / 2, 10);
  end.writeUInt32LE(directory.length, 12);
  end.writeUInt32LE(offset, 16);
  return Buffer.concat([...locals, directory, end]);
}

module.exports = { hfTokenizerFiles, zipFiles, vocabOf, specialIdsOf, TokenizerErrorCode };
