//! Compiles the protocol with protox (pure Rust, no system `protoc`). Service code is generated
//! only with the `grpc` feature so the wasm filter links prost messages alone.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["airouter/v1/sync.proto", "airouter/v1/admin.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["."])?;
    let services = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_server(services)
        .build_client(services)
        .compile_fds(descriptors)?;
    Ok(())
}
