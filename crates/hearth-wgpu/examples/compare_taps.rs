//! Debug aid: prefill a prompt on the CPU and wgpu backends and print, for every graph buffer,
//! the normalised MSE of the wgpu values against the CPU's (first divergence = suspect op).
//! Usage: cargo run --release -p hearth-wgpu --example compare_taps -- <model.gguf> "<prompt>"

use hearth_core::backend::{run_step, Backend, Readback, TopK};
use hearth_core::gguf::GgufFile;
use hearth_core::graph::{LogitsMode, SeqStep, StepInput};
use hearth_core::kv::{KvGroup, KvType};
use hearth_core::model::Model;
use hearth_core::tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("model path")?;
    let prompt = args.get(2).map(String::as_str).unwrap_or("The capital of France is");
    let file = GgufFile::open(std::path::Path::new(path))?;
    let tokens = Tokenizer::from_gguf(&file.metadata)?.encode(prompt, true, false)?;
    let mut cpu = hearth_cpu::CpuBackend::with_options(hearth_cpu::CpuOptions::from_env())?;
    let mut gpu = hearth_wgpu::WgpuBackend::new(hearth_wgpu::WgpuOptions::from_env())?;
    if let Some(steps) = std::env::var("HEARTH_DECODE_STEPS").ok().and_then(|v| v.parse::<usize>().ok()) {
        return decode(&file, &tokens, steps, cpu, gpu);
    }
    let model_c = Model::load(&file, &mut cpu, None, &mut |_, _| {})?;
    let model_g = Model::load(&file, &mut gpu, None, &mut |_, _| {})?;
    // One sequence in blocks 0, 1, 2, ... of every group; KV type from HEARTH_KV_TYPE (f16).
    let kv_type = KvType::parse(&std::env::var("HEARTH_KV_TYPE").unwrap_or_else(|_| "f16".into()))?;
    let block_size = 16;
    let n_blocks = tokens.len().div_ceil(block_size);
    let groups: Vec<KvGroup> = model_c.kv_groups().into_iter().map(|g| KvGroup { n_blocks, ..g }).collect();
    let tables: Vec<Vec<u32>> = groups.iter().map(|_| (0..n_blocks as u32).collect()).collect();
    let kv_c = cpu.alloc_kv(model_c.kv_layout(kv_type, block_size, groups.clone()))?;
    let kv_g = gpu.alloc_kv(model_g.kv_layout(kv_type, block_size, groups))?;
    let seqs = [SeqStep { n_tokens: tokens.len(), pos0: 0, block_tables: &tables }];
    let input = StepInput { tokens: &tokens, seqs: &seqs };
    let full = model_c.build_graph(tokens.len(), 1, LogitsMode::Last);
    let limit: usize = std::env::var("HEARTH_CUT_LIMIT").ok().and_then(|v| v.parse().ok()).unwrap_or(full.ops.len());
    // Graphs cut after op `cut`, returning that op's output: the first op whose error jumps is
    // the suspect.
    let from: usize = std::env::var("HEARTH_CUT_FROM").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let stride: usize = std::env::var("HEARTH_CUT_STRIDE").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    for cut in (from.max(1)..=limit.min(full.ops.len())).step_by(stride.max(1)) {
        let mut g = full.clone();
        g.ops.truncate(cut);
        let Some(&out) = g.ops[cut - 1].outputs().last() else { continue };
        g.logits = out;
        let (mut a, mut b, mut top) = (Vec::new(), Vec::new(), TopK::default());
        let gc = cpu.compile(&g)?;
        run_step(&mut cpu, gc, kv_c, input, Readback::Logits, &mut a, &mut top)?;
        let gg = gpu.compile(&g)?;
        run_step(&mut gpu, gg, kv_g, input, Readback::Logits, &mut b, &mut top)?;
        cpu.release_graph(gc);
        gpu.release_graph(gg);
        let err: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let norm: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
        println!(
            "{cut:>4} {:<50} {:<16} nmse {:.3e}",
            format!("{:?}", g.ops[cut - 1]).chars().take(50).collect::<String>(),
            g.bufs[out.0 as usize].name,
            err / norm.max(1e-30)
        );
    }
    Ok(())
}

/// Prefill, then `steps` decode steps fed with the CPU's greedy tokens: logits error per step and
/// both backends' top-3.
fn decode(
    file: &GgufFile,
    tokens: &[u32],
    steps: usize,
    cpu: hearth_cpu::CpuBackend,
    gpu: hearth_wgpu::WgpuBackend,
) -> Result<(), Box<dyn std::error::Error>> {
    use hearth_core::engine::{EngineOptions, Session};
    let options = EngineOptions { n_ctx: 96, ..EngineOptions::default() };
    let mut sc = Session::load(file, Box::new(cpu), &options, &mut |_, _| {})?;
    let mut sg = Session::load(file, Box::new(gpu), &options, &mut |_, _| {})?;
    let top = |l: &[f32]| {
        let mut idx: Vec<usize> = (0..l.len()).collect();
        idx.sort_by(|&i, &j| l[j].total_cmp(&l[i]));
        idx[..3].iter().map(|&i| (i, l[i])).collect::<Vec<_>>()
    };
    let mut input = tokens.to_vec();
    for step in 0..=steps {
        let a = sc.eval(&input, LogitsMode::Last)?.to_vec();
        let b = sg.eval(&input, LogitsMode::Last)?.to_vec();
        let err: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let norm: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
        println!("step {step}: nmse {:.3e}\n  cpu {:?}\n  gpu {:?}", err / norm, top(&a), top(&b));
        input = vec![top(&a)[0].0 as u32];
    }
    Ok(())
}
