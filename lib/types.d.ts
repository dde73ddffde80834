// The public types lib/'s JSDoc refers to, in one place.
export type {
  OffloadInfo,
  OperationOptions,
  EntropyBase,
  KvFileContents,
  ChatMessage,
  FormatChatOptions,
  FormattedChatResult,
  ChatFormat,
  ParseChatOutputOptions,
  ParseChatOutputResult,
  SamplingParams,
} from '../index';
