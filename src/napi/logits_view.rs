//! The zero-copy `Float32Array` that `ctx.getLogits()` returns: an external ArrayBuffer over
//! llama.cpp's logits row. The buffer is only valid until llama.cpp writes that row again, so
//! the session detaches it (on the JS thread) before queueing any operation that may decode or
//! otherwise invalidate it, and on dispose. A detached view has length 0: stale reads are
//! impossible.
//!
//! Two lifetime rules keep the raw memory safe:
//! - the session keeps only a *weak* reference to the buffer (no leak when JS drops it);
//! - the buffer carries a hidden property pointing at the SessionContext object, so the context
//!   (and with it llama.cpp's memory) cannot be garbage-collected while the view is reachable.

use std::ffi::c_void;
use std::ptr::{self, NonNull};

use napi::{sys, Env};

use super::convert::{js, Code};
use crate::error::Error;

/// Hidden (non-enumerable) property of the ArrayBuffer that keeps its context alive.
const OWNER_PROPERTY: &[u8] = b"__llamaBranchContext\0";

#[derive(Default)]
pub struct LogitsView {
    /// Weak reference to the live ArrayBuffer, if one was handed out since the last revoke.
    buffer: Option<sys::napi_ref>,
    /// The logits row it covers.
    row: usize,
}

// SAFETY: the session is built on the loader thread (with no reference yet) and then used on
// the JS thread only; the napi reference is never touched from another thread.
unsafe impl Send for LogitsView {}

unsafe extern "C" fn keep_memory(_env: sys::napi_env, _data: *mut c_void, _hint: *mut c_void) {
    // llama.cpp owns the memory; nothing to free.
}

fn check(status: sys::napi_status, what: &str) -> napi::Result<(), Code> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(js(Error::Internal(format!(
            "{what} failed (napi status {status})"
        ))))
    }
}

impl LogitsView {
    /// A Float32Array of `len` floats over `row`, sharing the ArrayBuffer handed out earlier in
    /// this step when it is still alive (so writes through one view are seen by all).
    ///
    /// # Safety
    /// `row` must stay valid for `len` floats until [`LogitsView::revoke`] is called; `owner`
    /// must be the JS object whose lifetime guards that memory.
    pub unsafe fn view(
        &mut self,
        env: &Env,
        row: NonNull<f32>,
        len: usize,
        owner: sys::napi_value,
    ) -> napi::Result<sys::napi_value, Code> {
        let env = env.raw();
        let buffer = match self.live_buffer(env, row.as_ptr() as usize) {
            Some(buffer) => buffer,
            None => {
                self.forget(env);
                let mut buffer = ptr::null_mut();
                let status = sys::napi_create_external_arraybuffer(
                    env,
                    row.as_ptr().cast(),
                    len * std::mem::size_of::<f32>(),
                    Some(keep_memory),
                    ptr::null_mut(),
                    &mut buffer,
                );
                if status == sys::Status::napi_no_external_buffers_allowed {
                    return Err(js(Error::Unsupported(
                        "this JavaScript runtime forbids external ArrayBuffers, so getLogits() cannot return a zero-copy view".into(),
                    )));
                }
                check(status, "napi_create_external_arraybuffer")?;
                let owner_property = sys::napi_property_descriptor {
                    utf8name: OWNER_PROPERTY.as_ptr().cast(),
                    name: ptr::null_mut(),
                    method: None,
                    getter: None,
                    setter: None,
                    value: owner,
                    attributes: sys::PropertyAttributes::default,
                    data: ptr::null_mut(),
                };
                check(
                    sys::napi_define_properties(env, buffer, 1, &owner_property),
                    "napi_define_properties",
                )?;
                let mut weak = ptr::null_mut();
                check(
                    sys::napi_create_reference(env, buffer, 0, &mut weak),
                    "napi_create_reference",
                )?;
                self.buffer = Some(weak);
                self.row = row.as_ptr() as usize;
                buffer
            }
        };
        let mut array = ptr::null_mut();
        check(
            sys::napi_create_typedarray(
                env,
                sys::TypedarrayType::float32_array,
                len,
                buffer,
                0,
                &mut array,
            ),
            "napi_create_typedarray",
        )?;
        Ok(array)
    }

    /// Detaches the handed-out buffer, if it is still alive. Every view over it reads as empty.
    pub fn revoke(&mut self, env: &Env) {
        let env = env.raw();
        if let Some(buffer) = self.live_buffer(env, self.row) {
            // SAFETY: `buffer` is an external ArrayBuffer we created, hence detachable.
            unsafe { sys::napi_detach_arraybuffer(env, buffer) };
        }
        self.forget(env);
    }

    fn live_buffer(&self, env: sys::napi_env, row: usize) -> Option<sys::napi_value> {
        let weak = self.buffer?;
        if row != self.row {
            return None;
        }
        let mut buffer = ptr::null_mut();
        let mut detached = false;
        // SAFETY: `weak` is a reference we created in this env and have not deleted.
        unsafe {
            if sys::napi_get_reference_value(env, weak, &mut buffer) != sys::Status::napi_ok
                || buffer.is_null()
                || sys::napi_is_detached_arraybuffer(env, buffer, &mut detached)
                    != sys::Status::napi_ok
                || detached
            {
                return None;
            }
        }
        Some(buffer)
    }

    fn forget(&mut self, env: sys::napi_env) {
        if let Some(weak) = self.buffer.take() {
            // SAFETY: created by napi_create_reference in this env, deleted once.
            unsafe { sys::napi_delete_reference(env, weak) };
        }
    }
}
