//! Compiles the protocol with protox (pure Rust, no system `protoc`). Service code is generated
//! only with the `grpc` feature so the wasm filter links prost messages alone; the services' and
//! methods' names are generated for both (`names.rs`), so the filter's calls name what the
//! proto declares.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["airouter/v1/sync.proto", "airouter/v1/admin.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["."])?;
    let mut names = String::new();
    for file in &descriptors.file {
        for service in &file.service {
            let service_name = service.name();
            names.push_str(&format!(
                "/// `{package}.{service_name}`.\npub mod {module} {{\n    pub const SERVICE: &str = \"{package}.{service_name}\";\n",
                package = file.package(),
                module = snake(service_name),
            ));
            for method in &service.method {
                names.push_str(&format!(
                    "    pub const {}: &str = \"{}\";\n",
                    snake(method.name()).to_uppercase(),
                    method.name()
                ));
            }
            names.push_str("}\n");
        }
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("names.rs"), names)?;
    let services = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_server(services)
        .build_client(services)
        .compile_fds(descriptors)?;
    Ok(())
}

/// `TakeMinuteCalls` -> `take_minute_calls`.
fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}
