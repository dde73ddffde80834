use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    napi_build::setup();
    build_chat_shim();
    find_shared_llama_next_to_addon();
}

/// With the `dynamic-backends` feature llama.cpp is a set of shared libraries (libllama,
/// libggml, libggml-base, libllama-common) that ship in the same folder as the .node
/// (scripts/prebuild.js), so the addon's search path for them is its own folder. On Linux it is
/// written as DT_RPATH rather than DT_RUNPATH: a RUNPATH only applies to the .node's direct
/// dependencies, an RPATH also to theirs (libllama needs libggml, found through the .node's
/// RPATH because the .node loaded libllama). Windows needs nothing: the loader looks for a DLL's
/// dependencies in the folder of the DLL that is loaded with an absolute path.
fn find_shared_llama_next_to_addon() {
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_DYNAMIC_BACKENDS");
    if env::var_os("CARGO_FEATURE_DYNAMIC_BACKENDS").is_none() {
        return;
    }
    match env::var("CARGO_CFG_TARGET_OS").as_deref() {
        Ok("linux") => {
            println!("cargo:rustc-cdylib-link-arg=-Wl,--disable-new-dtags");
            println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN");
        }
        Ok("macos") => println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,@loader_path"),
        _ => {}
    }
}

/// Compiles src/llama/chat_shim.cpp against the llama.cpp tree that llama-cpp-sys-2 built. That crate
/// (`links = "llama"`) exports its OUT_DIR as DEP_LLAMA_ROOT; the cmake cache there records the
/// llama.cpp source directory, whose common/ and vendor/ headers the shim needs. libllama-common
/// itself is already linked by llama-cpp-sys-2 (its `common` feature).
fn build_chat_shim() {
    println!("cargo:rerun-if-changed=src/llama/chat_shim.cpp");
    println!("cargo:rerun-if-changed=src/llama/determinism_shim.cpp");
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_ROOT");
    let root =
        PathBuf::from(env::var("DEP_LLAMA_ROOT").expect(
            "DEP_LLAMA_ROOT is not set: llama-cpp-sys-2 did not export its build directory",
        ));
    let cache_file = root.join("build").join("CMakeCache.txt");
    println!("cargo:rerun-if-changed={}", cache_file.display());
    let cache = fs::read_to_string(&cache_file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", cache_file.display()));
    // Every build has the RPC backend (.cargo/config.toml sets GGML_RPC=ON). The sys crate only
    // configures CMake once per build directory, so a target directory whose llama.cpp was built
    // before that setting keeps building without it: say how to fix it rather than ship an addon
    // whose rpcServers / serveRpc report ERR_UNSUPPORTED.
    assert!(
        cache
            .lines()
            .any(|l| l.starts_with("GGML_RPC:") && l.ends_with("=ON")),
        "llama.cpp in {} was configured without GGML_RPC=ON (a target directory built by an \
         older llama-branch). `npm run build` cleans it; with plain cargo run \
         `cargo clean --release -p llama-cpp-sys-2` once.",
        root.display()
    );
    // Deterministic contexts need the patched reference flash attention (.cargo/config.toml,
    // patches/ggml/deterministic.cmake). A llama.cpp configured without the patch would build,
    // but their logits would depend on where the KV cells sit: refuse it, saying how to fix it.
    println!("cargo:rerun-if-changed=patches/ggml/deterministic.cmake");
    println!("cargo:rerun-if-changed=patches/ggml/flash-attn-order-independent.inc");
    println!("cargo:rerun-if-changed=patches/ggml/kquant-cols.inc");
    assert!(
        cache
            .lines()
            .any(|l| l.starts_with("CMAKE_PROJECT_ggml_INCLUDE")
                && l.ends_with("deterministic.cmake")),
        "llama.cpp in {} was configured without llama-branch's ggml patch \
         (CMAKE_PROJECT_ggml_INCLUDE, .cargo/config.toml). With plain cargo run \
         `cargo clean --release -p llama-cpp-sys-2` once.",
        root.display()
    );
    let src = cache
        .lines()
        .find_map(|l| l.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL="))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no CMAKE_HOME_DIRECTORY in {}", cache_file.display()));
    assert!(
        src.join("common").join("chat.h").is_file(),
        "llama.cpp source at {} has no common/chat.h",
        src.display()
    );
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("src/llama/chat_shim.cpp")
        .file("src/llama/determinism_shim.cpp");
    // -isystem: the shim's own warnings stay visible, llama.cpp's headers' do not.
    for dir in [
        src.clone(),
        src.join("common"),
        // llama-context.h, for determinism_shim.cpp
        src.join("src"),
        src.join("include"),
        src.join("ggml").join("include"),
        src.join("vendor"),
    ] {
        build.flag(format!("-isystem{}", dir.display()));
    }
    build
        .flag_if_supported("-std=c++17")
        .pic(true)
        .compile("llama_branch_chat_shim");
}
