// The hand-written public surface (index.d.ts) against the native contract generated from the
// Rust #[napi] items (lib/native.d.ts): every options/result object must have exactly the same
// fields, and what the public types accept must be accepted by the Rust DTOs. A field added,
// renamed or retyped on one side only fails `tsc -p test/types` in npm test.

import type * as Native from '../../lib/native';
import type * as Public from '../../index';

/** true only when A and B are the same type (not merely mutually assignable). */
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
/** true when every value of P is a valid N. */
type Accepts<N, P> = [P] extends [N] ? true : false;

function check<T extends true>(): T | undefined {
  return undefined;
}

// Same field names, in both directions.
check<Equal<keyof Native.ContextOptions, keyof Public.ContextOptions>>();
check<Equal<keyof Native.SamplingParams, keyof Public.SamplingParams>>();
check<Equal<keyof Native.PenaltyParams, keyof Public.PenaltyParams>>();
check<Equal<keyof Native.MirostatParams, keyof Public.MirostatParams>>();
check<Equal<keyof Native.DryParams, keyof Public.DryParams>>();
check<Equal<keyof Native.XtcParams, keyof Public.XtcParams>>();
check<Equal<keyof Native.AdvancedSamplingParams, keyof Public.AdvancedSamplingParams>>();
check<Equal<keyof Native.TokenBias, keyof Public.TokenBias>>();
check<Equal<keyof Native.KvFileContents, keyof Public.KvFileContents>>();
check<Equal<keyof Native.KvPressureInfo, keyof Public.KvPressure>>();
check<Equal<keyof Native.Produced, keyof Public.Produced>>();

// What the public types promise to accept, the Rust DTOs accept (field types and optionality).
// (lib/index.js turns a `URL` modelPath into a path before the native call.)
check<Accepts<Native.ContextOptions, Omit<Public.ContextOptions, 'modelPath'> & { modelPath: string }>>();
check<Accepts<Native.SamplingParams, Public.SamplingParams>>();
check<Accepts<Native.AdvancedSamplingParams, Public.AdvancedSamplingParams>>();

// What the Rust returns is what the public types describe.
check<Accepts<Public.KvFileContents, Native.KvFileContents>>();
check<Accepts<Public.KvPressure, Native.KvPressureInfo>>();
check<Accepts<Public.Produced, Native.Produced>>();
