//! The KV cache's element types (`typeK`, `typeV`) and flash attention (`flashAttention`):
//! parsed from `createContext`'s options and checked together, so that a combination llama.cpp
//! refuses is an `ERR_INVALID_ARG` that says what to change instead of a null context.

use crate::error::{Error, Result};

/// Element type of the K or V half of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub const NAMES: &'static str = "'f16', 'q8_0' or 'q4_0'";

    pub fn parse(option: &str, value: Option<&str>) -> Result<KvType> {
        match value {
            None | Some("f16") => Ok(KvType::F16),
            Some("q8_0") => Ok(KvType::Q8_0),
            Some("q4_0") => Ok(KvType::Q4_0),
            Some(other) => Err(Error::invalid(format!(
                "options.{option} must be {}, got \"{other}\" (q8_0 takes about half the KV \
                 memory of f16, q4_0 about a quarter)",
                KvType::NAMES
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    pub fn is_quantized(self) -> bool {
        self != KvType::F16
    }

    /// Elements per quantization block: a head size must be a multiple of it (llama.cpp
    /// refuses the context otherwise).
    pub fn block_size(self) -> u32 {
        match self {
            KvType::F16 => 1,
            KvType::Q8_0 | KvType::Q4_0 => 32,
        }
    }
}

/// When attention runs as one fused flash-attention op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashAttention {
    /// llama.cpp decides at context creation (on where the backend supports the fused op).
    Auto,
    On,
    Off,
}

impl FlashAttention {
    pub fn parse(value: Option<&str>) -> Result<FlashAttention> {
        match value {
            None | Some("auto") => Ok(FlashAttention::Auto),
            Some("on") => Ok(FlashAttention::On),
            Some("off") => Ok(FlashAttention::Off),
            Some(other) => Err(Error::invalid(format!(
                "options.flashAttention must be 'auto', 'on' or 'off', got \"{other}\""
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FlashAttention::Auto => "auto",
            FlashAttention::On => "on",
            FlashAttention::Off => "off",
        }
    }
}

/// The KV options of a context, checked together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvConfig {
    pub type_k: KvType,
    pub type_v: KvType,
    pub flash_attention: FlashAttention,
    /// Computed by the deterministic kernels (`deterministic: true`): the cells hold other
    /// numbers than the default kernels write, so a state records it (engine/fingerprint.rs).
    pub deterministic: bool,
}

impl KvConfig {
    pub fn resolve(
        type_k: Option<&str>,
        type_v: Option<&str>,
        flash_attention: Option<&str>,
    ) -> Result<KvConfig> {
        let type_k = KvType::parse("typeK", type_k)?;
        let type_v = KvType::parse("typeV", type_v)?;
        let mut flash_attention = FlashAttention::parse(flash_attention)?;
        // llama.cpp reads a quantized V cache only inside the flash-attention kernel.
        if type_v.is_quantized() {
            if flash_attention == FlashAttention::Off {
                return Err(Error::invalid(format!(
                    "options.typeV '{}' needs flash attention, but flashAttention is 'off': use \
                     flashAttention 'auto' or 'on', or typeV 'f16'",
                    type_v.name()
                )));
            }
            // What llama.cpp does with 'auto' here; said so the context reports what runs.
            flash_attention = FlashAttention::On;
        }
        Ok(KvConfig {
            type_k,
            type_v,
            flash_attention,
            deterministic: false,
        })
    }

    /// The settings of a `deterministic: true` context. Flash attention is required: its
    /// one-row kernel adds a sequence's cells in buffer order and skips every other cell, while
    /// the plain path's softmax and KQ·V sums group cells by their absolute buffer index into
    /// SIMD lanes, so a branch's numbers would depend on where its cells sit
    /// (docs/determinism.md). 'auto' becomes 'on'.
    pub fn deterministic(self) -> Result<KvConfig> {
        if self.flash_attention == FlashAttention::Off {
            return Err(Error::invalid(
                "options.deterministic needs flash attention, but flashAttention is 'off': use \
                 flashAttention 'auto' or 'on' with deterministic: true",
            ));
        }
        Ok(KvConfig {
            flash_attention: FlashAttention::On,
            deterministic: true,
            ..self
        })
    }

    /// Checks the types against the model's attention head sizes (K and V per layer), which
    /// quantized types must divide into whole blocks.
    pub fn check_heads(&self, head_k: u32, head_v: u32) -> Result<()> {
        for (option, t, head) in [
            ("typeK", self.type_k, head_k),
            ("typeV", self.type_v, head_v),
        ] {
            if head % t.block_size() != 0 {
                return Err(Error::invalid(format!(
                    "options.{option} '{}' stores blocks of {} values, but this model's attention \
                     heads have {head}; use {option} 'f16'",
                    t.name(),
                    t.block_size()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(e: Error) -> &'static str {
        e.code()
    }

    #[test]
    fn defaults_are_f16_and_auto() {
        let c = KvConfig::resolve(None, None, None).unwrap();
        assert_eq!(
            (c.type_k, c.type_v, c.flash_attention),
            (KvType::F16, KvType::F16, FlashAttention::Auto)
        );
    }

    #[test]
    fn quantized_v_turns_auto_into_on_and_refuses_off() {
        let c = KvConfig::resolve(Some("q8_0"), Some("q4_0"), None).unwrap();
        assert_eq!(c.flash_attention, FlashAttention::On);
        let e = KvConfig::resolve(None, Some("q8_0"), Some("off")).unwrap_err();
        assert_eq!(code(e.clone()), "ERR_INVALID_ARG");
        assert!(
            e.to_string().contains("flashAttention 'auto' or 'on'"),
            "{e}"
        );
        // a quantized K alone works without flash attention
        let c = KvConfig::resolve(Some("q4_0"), None, Some("off")).unwrap();
        assert_eq!(c.flash_attention, FlashAttention::Off);
    }

    #[test]
    fn unknown_names_are_refused_with_the_choices() {
        for (k, v, fa) in [
            (Some("q5_1"), None, None),
            (None, Some("F16"), None),
            (None, None, Some("true")),
            (Some(""), None, None),
        ] {
            let e = KvConfig::resolve(k, v, fa).unwrap_err();
            assert_eq!(e.code(), "ERR_INVALID_ARG");
            assert!(e.to_string().contains("must be"), "{e}");
        }
    }

    #[test]
    fn heads_must_hold_whole_blocks() {
        let c = KvConfig::resolve(Some("q8_0"), Some("q8_0"), None).unwrap();
        assert!(c.check_heads(256, 256).is_ok());
        let e = c.check_heads(80, 256).unwrap_err();
        assert!(e.to_string().contains("typeK 'f16'"), "{e}");
        assert!(KvConfig::resolve(None, None, None)
            .unwrap()
            .check_heads(80, 80)
            .is_ok());
    }

    #[test]
    fn deterministic_turns_flash_attention_on_and_refuses_off() {
        let d = KvConfig::resolve(None, None, None)
            .unwrap()
            .deterministic()
            .unwrap();
        assert!(d.deterministic && d.flash_attention == FlashAttention::On);
        let e = KvConfig::resolve(None, None, Some("off"))
            .unwrap()
            .deterministic()
            .unwrap_err();
        assert_eq!(e.code(), "ERR_INVALID_ARG");
        assert!(e.to_string().contains("deterministic"), "{e}");
    }
}
