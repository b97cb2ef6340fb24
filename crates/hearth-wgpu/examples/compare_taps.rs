//! Debug aid: prefill a prompt on the CPU and wgpu backends and print, for every graph buffer,
//! the normalised MSE of the wgpu values against the CPU's (first divergence = suspect op).
//! Usage: cargo run --release -p hearth-wgpu --example compare_taps -- <model.gguf> "<prompt>"

use hearth_core::backend::Backend;
use hearth_core::gguf::GgufFile;
use hearth_core::graph::{LogitsMode, Op, StepInput};
use hearth_core::model::Model;
use hearth_core::tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("model path")?;
    let prompt = args.get(2).map(String::as_str).unwrap_or("The capital of France is");
    let file = GgufFile::open(std::path::Path::new(path))?;
    let tokens = Tokenizer::from_gguf(&file.metadata)?.encode(prompt, true, false)?;
    let mut cpu = hearth_cpu::CpuBackend::new(None)?;
    let mut gpu = hearth_wgpu::WgpuBackend::new(hearth_wgpu::WgpuOptions::from_env())?;
    let model_c = Model::load(&file, &mut cpu, &mut |_, _| {})?;
    let model_g = Model::load(&file, &mut gpu, &mut |_, _| {})?;
    let kv_c = cpu.alloc_kv(model_c.kv_layout(64))?;
    let kv_g = gpu.alloc_kv(model_g.kv_layout(64))?;
    let full = model_c.build_graph(tokens.len(), LogitsMode::Last);
    let limit: usize = std::env::var("CUT_LIMIT").ok().and_then(|v| v.parse().ok()).unwrap_or(full.ops.len());
    // Graphs cut after op `cut`, returning that op's output: the first op whose error jumps is
    // the suspect.
    for cut in 1..=limit.min(full.ops.len()) {
        let mut g = full.clone();
        g.ops.truncate(cut);
        let out = match &g.ops[cut - 1] {
            Op::Embed { out, .. } | Op::RmsNorm { out, .. } | Op::MatMul { out, .. } | Op::Attention { out, .. }
            | Op::Add { out, .. } | Op::SwiGlu { out, .. } | Op::GeGlu { out, .. } | Op::LastRow { out, .. } => *out,
            Op::Rope { x, .. } | Op::Scale { x, .. } => *x,
            Op::StoreKv { .. } => continue,
        };
        g.logits = out;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let gc = cpu.compile(&g)?;
        cpu.execute(gc, kv_c, StepInput { tokens: &tokens, pos0: 0 }, &mut a)?;
        let gg = gpu.compile(&g)?;
        gpu.execute(gg, kv_g, StepInput { tokens: &tokens, pos0: 0 }, &mut b)?;
        let err: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let norm: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
        println!("{cut:>4} {:<50} {:<16} nmse {:.3e}", format!("{:?}", g.ops[cut - 1]).chars().take(50).collect::<String>(), g.bufs[out.0 as usize].name, err / norm.max(1e-30));
    }
    Ok(())
}
