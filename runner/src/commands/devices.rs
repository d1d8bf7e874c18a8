//! `bmoe devices`: what the ggml registry of this build holds.
use crate::cli::engine_args::DevicesArgs;

/// Lists the backends compiled in and every device they expose.
pub fn devices(args: DevicesArgs) -> anyhow::Result<()> {
    let devices = bmoe_engine::devices();
    if args.out.json() {
        let v = serde_json::json!({
            "backends": bmoe_engine::backend_names(),
            "devices": devices,
            "system_info": bmoe_engine::system_info(),
            "cpu_variant": bmoe_engine::cpu_variant(),
            "backend_modules": bmoe_engine::backend_modules(),
            "page_moves": bmoe_engine::page_moves().label(),
            // The self-check's reason when pages are released (the text's `page moves:` line).
            "page_moves_why": match bmoe_engine::page_moves() {
                bmoe_engine::PageMoves::Release(why) => Some(why),
                bmoe_engine::PageMoves::Move => None,
            },
            "cpu_repack": bmoe_engine::cpu_repack_available(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("backends: {}", bmoe_engine::backend_names().join(", "));
    println!(
        "{:<12} {:<6} {:<8} {:>12} {:>11}  description",
        "device", "kind", "backend", "memory MiB", "host buffer"
    );
    for d in &devices {
        println!(
            "{:<12} {:<6} {:<8} {:>12} {:>11}  {}",
            d.name,
            format!("{:?}", d.kind).to_lowercase(),
            d.backend,
            d.memory_total >> 20,
            match (d.host_buffer, d.computes_on_host_buffer) {
                (true, true) => "computes on",
                (true, false) => "copies from",
                _ => "no",
            },
            d.description
        );
    }
    println!("system: {}", bmoe_engine::system_info());
    println!("cpu variant: {}", bmoe_engine::cpu_variant().line());
    println!("modules: {}", crate::ident::modules_line());
    println!("vulkan: {}", vulkan_line(&devices));
    println!("repack: {}", repack_line());
    println!("page moves: {}", page_moves_line(bmoe_engine::page_moves()));
    println!("cores: {}", cores_line());
    Ok(())
}

/// Whether ggml's Vulkan backend is loaded (the module `libggml-vulkan.so` beside the CPU variants),
/// and how to get or see a device (docs/vulkan.md).
fn vulkan_line(devices: &[bmoe_engine::DeviceInfo]) -> String {
    let names: Vec<&str> = devices
        .iter()
        .filter(|d| d.backend == "Vulkan")
        .map(|d| d.name.as_str())
        .collect();
    if !names.is_empty() {
        format!(
            "{} (`--device {}` runs wide prefill pieces there)",
            names.join(", "),
            names[0]
        )
    } else if bmoe_engine::backend_names().iter().any(|b| b == "Vulkan") {
        "module loaded, no device found: a CPU-type device (Mesa's lavapipe) is listed only with GGML_VK_VISIBLE_DEVICES=0".into()
    } else if bmoe_engine::backend_modules().is_some() {
        "no module (libggml-vulkan.so) beside the CPU variants: scripts/build-vulkan builds it and puts it there".into()
    } else {
        "not in this build (the backends are linked in; the default build loads libggml-vulkan.so when present)".into()
    }
}

/// Whether `repack = "auto"` can take llama.cpp's repacked kernels in this build.
fn repack_line() -> &'static str {
    if bmoe_engine::cpu_repack_available() {
        "CPU_REPACK (repack = \"auto\" repacks the weights whose type has a kernel on this CPU: Q4_0 with AVX2, dotprod or i8mm, ...; rows record repacked_tensors)"
    } else {
        "none in this build: every kernel reads the file's own layout"
    }
}

/// `move` with the mechanism, or `release` with the self-check's reason.
fn page_moves_line(v: &bmoe_engine::PageMoves) -> String {
    match v {
        bmoe_engine::PageMoves::Move => "move (mremap MREMAP_DONTUNMAP keeps evicted pages)".into(),
        bmoe_engine::PageMoves::Release(why) => format!("release ({why})"),
    }
}

/// The usable cores, their maximum frequencies, and what `cpus = "auto"` picks (crate::cores).
fn cores_line() -> String {
    use crate::config::cpus::{cpulist, Cpus};
    let cores = crate::placement::cores::read_topology(
        std::path::Path::new(crate::placement::cores::SYSFS_CPU),
        bmoe_engine::process_cpus(),
    );
    let freqs: Vec<String> = cores
        .iter()
        .map(|c| match c.max_khz {
            Some(k) => format!("{}:{:.2}", c.id, k as f64 / 1e6),
            None => format!("{}:?", c.id),
        })
        .collect();
    match crate::placement::cores::choose(&cores, &Cpus::Auto) {
        Ok(c) if !c.compute.is_empty() => format!(
            "{} GHz; auto computes on {} ({})",
            freqs.join(" "),
            cpulist(&c.compute),
            c.why
        ),
        Ok(c) => format!("{} GHz; {}", freqs.join(" "), c.why),
        Err(e) => format!("{} GHz; {e}", freqs.join(" ")),
    }
}
