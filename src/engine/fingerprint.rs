//! What a saved KV state was computed by: the model, llama.cpp's state format and the context
//! settings that change the bytes of a state. A state is loaded only into a context whose
//! fingerprint is equal; the first difference is named in the error. Pure (the napi layer
//! gathers the inputs from the model and context): unit-tested on values.

use crate::error::{Error, Result};

/// FNV-1a, 64 bits: small, dependency-free and stable across builds and platforms (a hash that
/// ends up in files must never change with the compiler or a crate update).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_from(0xcbf2_9ce4_8422_2325, bytes)
}

fn fnv1a64_from(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fingerprint {
    /// FNV-1a over the model's size, parameter count and every GGUF metadata pair.
    pub model: u64,
    /// The model as a person reads it (llama.cpp's description), for messages only.
    pub model_name: String,
    /// llama.cpp's sequence-state format version and magic.
    pub state_format: u32,
    /// `typeK`, `typeV` and flash attention (which lays V out transposed or not).
    pub kv: String,
}

impl Fingerprint {
    /// The fingerprint of a model (size, parameters, metadata pairs in file order) under the
    /// given state format and KV settings.
    pub fn new(
        size_bytes: u64,
        n_params: u64,
        metadata: &[(String, String)],
        model_name: &str,
        state_format: u32,
        kv: String,
    ) -> Fingerprint {
        let mut h = fnv1a64(&size_bytes.to_le_bytes());
        h = fnv1a64_from(h, &n_params.to_le_bytes());
        for (k, v) in metadata {
            // Lengths first, so ("ab", "c") and ("a", "bc") hash apart.
            h = fnv1a64_from(h, &(k.len() as u64).to_le_bytes());
            h = fnv1a64_from(h, k.as_bytes());
            h = fnv1a64_from(h, &(v.len() as u64).to_le_bytes());
            h = fnv1a64_from(h, v.as_bytes());
        }
        Fingerprint {
            model: h,
            model_name: model_name.to_string(),
            state_format,
            kv,
        }
    }

    /// `ERR_STATE_MISMATCH` naming the first difference between a saved state's fingerprint
    /// (`self`) and this context's (`here`).
    pub fn check_matches(&self, here: &Fingerprint, what: &str) -> Result<()> {
        let why = if self.model != here.model {
            format!(
                "it was saved with another model ({} [{:016x}]; this context runs {} [{:016x}])",
                self.model_name, self.model, here.model_name, here.model
            )
        } else if self.state_format != here.state_format {
            format!(
                "it was saved in llama.cpp state format {}, this build reads format {}",
                self.state_format, here.state_format
            )
        } else if self.kv != here.kv {
            format!(
                "it was saved by a context with {}, this context has {}",
                self.kv, here.kv
            )
        } else {
            return Ok(());
        };
        Err(Error::StateMismatch(format!(
            "{what}: {why}; load it into a context created with the same model and settings"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(meta: &[(&str, &str)], kv: &str) -> Fingerprint {
        let meta: Vec<(String, String)> = meta
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Fingerprint::new(100, 10, &meta, "m", 4, kv.into())
    }

    #[test]
    fn fnv_matches_the_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn any_difference_is_a_mismatch_naming_it() {
        let a = fp(&[("general.name", "x")], "typeK=f16");
        assert!(a.check_matches(&a.clone(), "f").is_ok());
        let other_model = fp(&[("general.name", "y")], "typeK=f16");
        let split = fp(&[("general.nam", "ex")], "typeK=f16");
        let other_kv = fp(&[("general.name", "x")], "typeK=q8_0");
        for (b, why) in [
            (other_model, "another model"),
            (split, "another model"),
            (other_kv, "typeK=q8_0"),
        ] {
            let e = a.check_matches(&b, "f").unwrap_err();
            assert_eq!(e.code(), "ERR_STATE_MISMATCH");
            assert!(e.to_string().contains(why), "{e}");
        }
        let mut other_format = a.clone();
        other_format.state_format = 5;
        assert!(a
            .check_matches(&other_format, "f")
            .unwrap_err()
            .to_string()
            .contains("format 4"));
    }
}
