// The public types lib/'s JSDoc names, in one place. They are declared in ../index.d.ts (the
// option and result shapes) and reach lib/ through here, so the class declarations generated
// from lib/ (types/, scripts/lib-typings.js) and lib's type check name the same types.
export type {
  BranchToken,
  ChatFormat,
  ChatMessage,
  EntropyBase,
  FormatChatOptions,
  FormattedChatResult,
  GenerateRequest,
  Generation,
  KvFileContents,
  KvPressure,
  LazyGrammarTriggers,
  OffloadInfo,
  OperationOptions,
  ParseChatOutputOptions,
  ParseChatOutputResult,
  Produced,
  ProgramGenOptions,
  ProgramGenResult,
  RunOptions,
  SamplingParams,
  SchedulerOptions,
  SchedulerStats,
  TokenBias,
} from '../index';
