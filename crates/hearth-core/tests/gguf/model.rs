//! Model-level errors on small synthetic GGUFs: `ModelConfig::from_metadata` and `Session::load`.

use super::parse;
use super::writer::GgufWriter;
use hearth_core::backend::{
    Backend, BackendCounters, Capability, GraphId, KvId, KvLayout, LogitsFuture, Readback, TopK, WeightData,
};
use hearth_core::engine::{EngineOptions, Session};
use hearth_core::gguf::Value;
use hearth_core::graph::{BufId, Graph, StepInput, WeightDesc, WeightId};
use hearth_core::model::ModelConfig;
use hearth_core::quant::GgmlType;
use hearth_core::{CoreError, Result};

/// A backend that only records what it is given (loading never executes anything), and refuses
/// the ops named `refuse` in `supports`.
#[derive(Default)]
struct RecordingBackend {
    uploaded: Vec<WeightDesc>,
    /// KV pools allocated, shared with the test (the backend moves into the session).
    kv_allocated: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    refuse: Option<&'static str>,
}

impl Backend for RecordingBackend {
    fn name(&self) -> &str {
        "recording"
    }
    fn variant(&self) -> Option<String> {
        None
    }
    fn supports(&self, what: Capability<'_>) -> std::result::Result<(), String> {
        match what {
            Capability::Op { op, .. } if Some(op.name()) == self.refuse => {
                Err(format!("{} (refused by the test)", op.name()))
            }
            _ => Ok(()),
        }
    }
    fn upload_weight(&mut self, desc: WeightDesc, data: WeightData) -> Result<WeightId> {
        // The reader promised this range is inside the source.
        assert!(data.source.slice(data.offset, data.len).is_some());
        self.uploaded.push(desc);
        Ok(WeightId(self.uploaded.len() as u32 - 1))
    }
    fn alloc_kv(&mut self, _: KvLayout) -> Result<KvId> {
        self.kv_allocated.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(KvId(0))
    }
    fn copy_kv_blocks(&mut self, _: KvId, _: &[hearth_core::kv::BlockCopy]) -> Result<()> {
        Err(CoreError::InvalidArgument("recording backend holds no KV".into()))
    }
    fn compile(&mut self, _graph: &Graph) -> Result<GraphId> {
        Err(CoreError::InvalidArgument("recording backend cannot compile".into()))
    }
    fn release_graph(&mut self, _: GraphId) {}
    fn submit(&mut self, _: GraphId, _: KvId, _: StepInput<'_>, _: Readback) -> Result<()> {
        Err(CoreError::InvalidArgument("recording backend cannot execute".into()))
    }
    fn ready(&mut self) -> Option<LogitsFuture> {
        None
    }
    fn take(&mut self, _: &mut Vec<f32>, _: &mut TopK) -> Result<()> {
        Err(CoreError::InvalidArgument("recording backend cannot execute".into()))
    }
    fn read_buffer(&self, _graph: GraphId, _name: &str) -> Option<Vec<f32>> {
        None
    }
    fn write_buffer(&mut self, _graph: GraphId, _buf: BufId, _words: &[u32]) -> Result<()> {
        Err(CoreError::InvalidArgument("a recording runs no steps".into()))
    }
    fn read_output(&mut self, _graph: GraphId, _buf: BufId, _words: &mut Vec<u32>) -> Result<()> {
        Err(CoreError::InvalidArgument("a recording runs no steps".into()))
    }
    fn kernel_profile(&mut self) -> Option<Vec<hearth_core::backend::KernelTime>> {
        None
    }

    fn counters(&self) -> BackendCounters {
        BackendCounters::default()
    }
    fn expert_tallies(&mut self) -> Result<hearth_core::backend::ExpertTallies> {
        Ok(Default::default())
    }
    fn memory_bytes(&self) -> u64 {
        0
    }
}

const EMBD: u64 = 8;
const FF: u64 = 16;
const VOCAB: u64 = 4;

/// The keys of a one-layer `arch` model of tiny_llama's sizes (2 query heads and 1 KV head of
/// size 4, FF hidden values, VOCAB tokens) and `extra` keys (their names after `{arch}.`).
fn tiny_keys(arch: &str, extra: &[(&str, Value)]) -> Vec<(String, Value)> {
    let tokens = Value::Array((0..VOCAB).map(|i| Value::String(format!("t{i}"))).collect());
    let mut kvs = vec![
        ("general.architecture".to_string(), Value::String(arch.into())),
        ("tokenizer.ggml.tokens".to_string(), tokens),
    ];
    let sizes = [
        ("block_count", Value::U32(1)),
        ("embedding_length", Value::U32(EMBD as u32)),
        ("attention.head_count", Value::U32(2)),
        ("attention.head_count_kv", Value::U32(1)),
        ("feed_forward_length", Value::U32(FF as u32)),
        ("context_length", Value::U32(64)),
    ];
    kvs.extend(sizes.iter().chain(extra).map(|(k, v)| (format!("{arch}.{k}"), v.clone())));
    kvs
}

/// A one-layer llama: 2 query heads and 1 KV head of size 4.
fn tiny_llama(skip_key: Option<&str>, skip_tensor: Option<&str>, override_kv: Option<(&str, Value)>) -> GgufWriter {
    let kvs = tiny_keys("llama", &[("attention.layer_norm_rms_epsilon", Value::F32(1e-5))]);
    f32_model(kvs, &TINY_LLAMA_TENSORS, skip_key, skip_tensor, override_kv)
}

/// tiny_llama's tensors (GGML dims).
const TINY_LLAMA_TENSORS: [(&str, &[u64]); 11] = [
    ("token_embd.weight", &[EMBD, VOCAB]),
    ("output_norm.weight", &[EMBD]),
    ("blk.0.attn_norm.weight", &[EMBD]),
    ("blk.0.attn_q.weight", &[EMBD, 8]),
    ("blk.0.attn_k.weight", &[EMBD, 4]),
    ("blk.0.attn_v.weight", &[EMBD, 4]),
    ("blk.0.attn_output.weight", &[8, EMBD]),
    ("blk.0.ffn_norm.weight", &[EMBD]),
    ("blk.0.ffn_gate.weight", &[EMBD, FF]),
    ("blk.0.ffn_up.weight", &[EMBD, FF]),
    ("blk.0.ffn_down.weight", &[FF, EMBD]),
];

/// tiny_llama as a dense granite: its keys under `granite.`, with Granite 3's four multipliers.
fn tiny_granite(skip_key: Option<&str>, override_kv: Option<(&str, Value)>) -> GgufWriter {
    let kvs = tiny_keys(
        "granite",
        &[
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("embedding_scale", Value::F32(12.0)),
            ("residual_scale", Value::F32(0.22)),
            ("attention.scale", Value::F32(0.0078125)),
            ("logit_scale", Value::F32(8.0)),
        ],
    );
    f32_model(kvs, &TINY_LLAMA_TENSORS, skip_key, None, override_kv)
}

#[test]
fn granite_reads_its_multipliers_and_requires_a_logit_scale() {
    use hearth_core::graph::Op;
    let file = parse(&tiny_granite(None, None).write().bytes).unwrap();
    let cfg = ModelConfig::from_metadata(&file.metadata).unwrap();
    assert_eq!((cfg.embd_scale, cfg.residual_scale, cfg.logits_factor), (Some(12.0), Some(0.22), Some(0.125)));
    assert_eq!(cfg.attn_scale, 0.0078125);
    assert_eq!(cfg.rope_mode, hearth_core::graph::RopeMode::Normal);
    // The embeddings, each block's output (attention, FFN) and the logits are scaled.
    let model =
        hearth_core::model::Model::load(&file, &mut RecordingBackend::default(), None, &mut |_, _| {}).expect("loads");
    let graph = model.build_graph(2, 1, hearth_core::graph::LogitsMode::Last);
    let factors: Vec<f32> = graph
        .ops
        .iter()
        .filter_map(|op| if let Op::Scale { factor, .. } = op { Some(*factor) } else { None })
        .collect();
    assert_eq!(factors, [12.0, 0.22, 0.22, 0.125]);
    // As in llama.cpp, an absent or zero optional multiplier is none.
    let file = parse(&tiny_granite(Some("granite.residual_scale"), None).write().bytes).unwrap();
    assert_eq!(ModelConfig::from_metadata(&file.metadata).unwrap().residual_scale, None);
    let file = parse(&tiny_granite(None, Some(("granite.attention.scale", Value::F32(0.0)))).write().bytes).unwrap();
    assert_eq!(ModelConfig::from_metadata(&file.metadata).unwrap().attn_scale, 0.5, "1 / sqrt(head_dim 4)");
    // The logit scale is required and must divide.
    let e = config_err(tiny_granite(Some("granite.logit_scale"), None));
    assert!(matches!(e, CoreError::MissingKey(ref k) if k == "granite.logit_scale"), "{e:?}");
    let e = config_err(tiny_granite(None, Some(("granite.logit_scale", Value::F32(0.0)))));
    assert!(matches!(e, CoreError::BadHyperParameter(ref m) if m.contains("logit_scale")), "{e:?}");
}

/// A GGUF of `kvs` (with `override_kv` replacing or adding one, and `skip_key` left out) and F32
/// `tensors` (but `skip_tensor`).
fn f32_model(
    mut kvs: Vec<(String, Value)>,
    tensors: &[(&str, &[u64])],
    skip_key: Option<&str>,
    skip_tensor: Option<&str>,
    override_kv: Option<(&str, Value)>,
) -> GgufWriter {
    if let Some((k, v)) = override_kv {
        match kvs.iter_mut().find(|(key, _)| key == k) {
            Some(slot) => slot.1 = v,
            None => kvs.push((k.to_string(), v)),
        }
    }
    let mut w = GgufWriter::new(3);
    for (k, v) in kvs {
        if Some(k.as_str()) != skip_key {
            w = w.kv(&k, v);
        }
    }
    for &(name, dims) in tensors {
        if Some(name) != skip_tensor {
            w = w.tensor(name, GgmlType::F32, dims);
        }
    }
    w
}

fn config_err(w: GgufWriter) -> CoreError {
    ModelConfig::from_metadata(&parse(&w.write().bytes).unwrap().metadata).expect_err("bad config accepted")
}

fn load(w: GgufWriter) -> (Result<Session>, usize) {
    let file = parse(&w.write().bytes).unwrap();
    let mut backend = RecordingBackend::default();
    let mut n_progress = 0;
    let _ = &mut backend;
    let session = Session::load(&file, Box::new(backend), &EngineOptions::default(), &mut |_, _| n_progress += 1);
    (session, n_progress)
}

#[test]
fn tiny_llama_loads() {
    let file = parse(&tiny_llama(None, None, None).write().bytes).unwrap();
    let cfg = ModelConfig::from_metadata(&file.metadata).unwrap();
    assert_eq!((cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim), (1, 8, 2, 1, 4));
    assert_eq!((cfg.n_ff, cfg.n_vocab, cfg.n_ctx_train), (16, 4, 64));
    let (session, n_progress) = load(tiny_llama(None, None, None));
    let session = session.unwrap();
    assert_eq!(n_progress, 11, "one progress call per uploaded tensor");
    assert_eq!(session.n_ctx(), 64);
}

#[test]
fn an_op_the_backend_refuses_fails_the_load_before_the_kv_pool_is_allocated() {
    let file = parse(&tiny_llama(None, None, None).write().bytes).unwrap();
    let backend = RecordingBackend { refuse: Some("rope"), ..RecordingBackend::default() };
    let allocated = backend.kv_allocated.clone();
    match Session::load(&file, Box::new(backend), &EngineOptions::default(), &mut |_, _| {}) {
        Err(CoreError::Unsupported { backend, what }) => {
            assert!(backend == "recording" && what.contains("rope"), "{what}")
        }
        Err(other) => panic!("expected Unsupported, got {other}"),
        Ok(_) => panic!("a refused op loaded"),
    }
    assert_eq!(allocated.load(std::sync::atomic::Ordering::SeqCst), 0, "the KV pool was allocated before the refusal");
    // Accepted, the same model allocates its pool.
    let backend = RecordingBackend::default();
    let allocated = backend.kv_allocated.clone();
    Session::load(&file, Box::new(backend), &EngineOptions::default(), &mut |_, _| {}).expect("loads");
    assert_eq!(allocated.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn unknown_architecture() {
    let e = config_err(tiny_llama(None, None, Some(("general.architecture", Value::String("mamba".into())))));
    assert!(matches!(e, CoreError::UnknownArchitecture(ref a) if a == "mamba"), "{e:?}");
    let e = config_err(tiny_llama(Some("general.architecture"), None, None));
    assert!(matches!(e, CoreError::MissingKey(ref k) if k == "general.architecture"), "{e:?}");
}

#[test]
fn missing_and_mistyped_hyper_parameters() {
    for key in [
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.feed_forward_length",
        "llama.context_length",
        "llama.attention.layer_norm_rms_epsilon",
        "tokenizer.ggml.tokens",
    ] {
        let e = config_err(tiny_llama(Some(key), None, None));
        assert!(matches!(e, CoreError::MissingKey(ref k) if k == key), "{key}: {e:?}");
    }
    let e = config_err(tiny_llama(None, None, Some(("llama.block_count", Value::String("1".into())))));
    assert!(matches!(e, CoreError::WrongType { ref key, found: "string", .. } if key == "llama.block_count"), "{e:?}");
    let e = config_err(tiny_llama(None, None, Some(("llama.embedding_length", Value::F32(8.0)))));
    assert!(matches!(e, CoreError::WrongType { found: "f32", .. }), "{e:?}");
    let e = config_err(tiny_llama(None, None, Some(("llama.attention.head_count", Value::I32(-2)))));
    assert!(matches!(e, CoreError::WrongType { found: "i32", .. }), "{e:?}");
    let e = config_err(tiny_llama(None, None, Some(("general.architecture", Value::U32(1)))));
    assert!(matches!(e, CoreError::WrongType { expected: "a string", .. }), "{e:?}");
    let e = config_err(tiny_llama(None, None, Some(("tokenizer.ggml.tokens", Value::U32(4)))));
    assert!(matches!(e, CoreError::WrongType { expected: "an array", .. }), "{e:?}");
}

#[test]
fn inconsistent_hyper_parameters() {
    let e = config_err(tiny_llama(None, None, Some(("llama.attention.head_count_kv", Value::U32(3)))));
    assert!(matches!(e, CoreError::BadHyperParameter(ref m) if m.contains("not a multiple of head_count_kv")), "{e:?}");
    let e = config_err(tiny_llama(None, None, Some(("llama.block_count", Value::U32(0)))));
    assert!(matches!(e, CoreError::BadHyperParameter(ref m) if m.contains("zero size")), "{e:?}");
    // Sizes whose products would overflow or exhaust memory must be rejected, not panic.
    for (key, v) in [
        ("llama.block_count", Value::U64(u64::MAX)),
        ("llama.block_count", Value::U64(1 << 40)),
        ("llama.attention.key_length", Value::U64(u64::MAX / 2)),
        ("llama.embedding_length", Value::U64(u64::MAX)),
        ("llama.attention.head_count", Value::U64(1 << 62)),
    ] {
        let e = config_err(tiny_llama(None, None, Some((key, v.clone()))));
        assert!(matches!(e, CoreError::BadHyperParameter(_)), "{key}={v:?}: {e:?}");
    }
}

#[test]
fn missing_tensor_and_wrong_shape_fail_session_load() {
    let (r, _) = load(tiny_llama(None, Some("blk.0.ffn_up.weight"), None));
    assert!(matches!(r, Err(CoreError::MissingTensor(ref t)) if t == "blk.0.ffn_up.weight"));
    let (r, _) = load(tiny_llama(None, Some("output_norm.weight"), None).tensor(
        "output_norm.weight",
        GgmlType::F32,
        &[EMBD + 1],
    ));
    match r {
        Err(CoreError::ShapeMismatch { tensor, expected, found }) => {
            assert_eq!(tensor, "output_norm.weight");
            assert_eq!((expected, found), (vec![EMBD], vec![EMBD + 1]));
        }
        other => panic!("expected ShapeMismatch, got {:?}", other.err()),
    }
    // Transposed projection.
    let (r, _) = load(tiny_llama(None, Some("blk.0.attn_k.weight"), None).tensor(
        "blk.0.attn_k.weight",
        GgmlType::F32,
        &[4, EMBD],
    ));
    assert!(matches!(r, Err(CoreError::ShapeMismatch { ref tensor, .. }) if tensor == "blk.0.attn_k.weight"));
    let (r, _) = load(tiny_llama(None, None, Some(("general.architecture", Value::String("mamba".into())))));
    assert!(matches!(r, Err(CoreError::UnknownArchitecture(_))));
}

/// A one-layer qwen3moe: tiny_llama's attention shapes with per-head q/k norms, and 4 experts of
/// 6 hidden values, 2 of them per token.
fn tiny_qwen3moe(skip_tensor: Option<&str>, override_kv: Option<(&str, Value)>) -> GgufWriter {
    let kvs = tiny_keys(
        "qwen3moe",
        &[
            ("expert_feed_forward_length", Value::U32(6)),
            ("expert_count", Value::U32(4)),
            ("expert_used_count", Value::U32(2)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ],
    );
    let tensors: [(&str, &[u64]); 14] = [
        ("token_embd.weight", &[EMBD, VOCAB]),
        ("output_norm.weight", &[EMBD]),
        ("blk.0.attn_norm.weight", &[EMBD]),
        ("blk.0.attn_q.weight", &[EMBD, 8]),
        ("blk.0.attn_k.weight", &[EMBD, 4]),
        ("blk.0.attn_v.weight", &[EMBD, 4]),
        ("blk.0.attn_q_norm.weight", &[4]),
        ("blk.0.attn_k_norm.weight", &[4]),
        ("blk.0.attn_output.weight", &[8, EMBD]),
        ("blk.0.ffn_norm.weight", &[EMBD]),
        ("blk.0.ffn_gate_inp.weight", &[EMBD, 4]),
        ("blk.0.ffn_gate_exps.weight", &[EMBD, 6, 4]),
        ("blk.0.ffn_up_exps.weight", &[EMBD, 6, 4]),
        ("blk.0.ffn_down_exps.weight", &[6, EMBD, 4]),
    ];
    f32_model(kvs, &tensors, None, skip_tensor, override_kv)
}

#[test]
fn a_mixture_of_experts_loads_its_expert_stacks_and_routes_in_the_graph() {
    use hearth_core::graph::{ExpertGating, Op};
    let file = parse(&tiny_qwen3moe(None, None).write().bytes).unwrap();
    let cfg = ModelConfig::from_metadata(&file.metadata).unwrap();
    let moe = cfg.moe.clone().expect("a MoE config");
    assert_eq!((moe.n_expert, moe.n_ff_expert, moe.routing.n_used), (4, 6, 2));
    assert!(moe.routing.normalize && moe.routing.gating == ExpertGating::Softmax && moe.routing.scale == 1.0);
    assert_eq!(cfg.qk_norm, hearth_core::model::QkNorm::PerHead);
    // Without expert_feed_forward_length, n_ff / n_used, as llama.cpp reads it.
    let file = parse(&tiny_qwen3moe(None, Some(("qwen3moe.expert_feed_forward_length", Value::U32(0)))).write().bytes)
        .unwrap();
    assert_eq!(ModelConfig::from_metadata(&file.metadata).unwrap().moe.expect("moe").n_ff_expert, 8);

    let file = parse(&tiny_qwen3moe(None, None).write().bytes).unwrap();
    let model =
        hearth_core::model::Model::load(&file, &mut RecordingBackend::default(), None, &mut |_, _| {}).expect("loads");
    // 864 values, 576 of them in the three expert stacks, of which a token reads 2 experts of 4.
    assert_eq!((model.parameters.total, model.parameters.active), (864, 576));
    let graph = model.build_graph(3, 1, hearth_core::graph::LogitsMode::Last);
    let names: Vec<&str> = graph.ops.iter().map(Op::name).collect();
    let ffn = names.iter().position(|n| *n == "route_experts").expect("a router");
    assert_eq!(
        names[ffn - 1..ffn + 6],
        [
            "mat_mul",
            "route_experts",
            "mat_mul_experts",
            "mat_mul_experts",
            "swiglu",
            "mat_mul_experts",
            "combine_experts"
        ]
    );
}

#[test]
fn a_mixture_of_experts_with_bad_expert_counts_or_tensors_is_refused() {
    let e = config_err(tiny_qwen3moe(None, Some(("qwen3moe.expert_used_count", Value::U32(5)))));
    assert!(matches!(e, CoreError::BadHyperParameter(ref m) if m.contains("expert_count 4")), "{e:?}");
    let e = config_err(tiny_qwen3moe(None, Some(("qwen3moe.expert_count", Value::U64(u64::MAX)))));
    assert!(matches!(e, CoreError::BadHyperParameter(_)), "{e:?}");
    let e = config_err(tiny_qwen3moe(None, Some(("qwen3moe.expert_feed_forward_length", Value::U64(1 << 40)))));
    assert!(matches!(e, CoreError::BadHyperParameter(_)), "{e:?}");
    let (r, _) = load(tiny_qwen3moe(Some("blk.0.ffn_down_exps.weight"), None));
    assert!(matches!(r, Err(CoreError::MissingTensor(ref t)) if t == "blk.0.ffn_down_exps.weight"), "{:?}", r.err());
    // The experts stacked on the wrong axis.
    let (r, _) = load(tiny_qwen3moe(Some("blk.0.ffn_up_exps.weight"), None).tensor(
        "blk.0.ffn_up_exps.weight",
        GgmlType::F32,
        &[EMBD, 4, 6],
    ));
    assert!(matches!(r, Err(CoreError::ShapeMismatch { ref tensor, .. }) if tensor == "blk.0.ffn_up_exps.weight"));
    // A backend without the expert ops refuses the model when it loads.
    let file = parse(&tiny_qwen3moe(None, None).write().bytes).unwrap();
    let backend = RecordingBackend { refuse: Some("mat_mul_experts"), ..RecordingBackend::default() };
    match Session::load(&file, Box::new(backend), &EngineOptions::default(), &mut |_, _| {}) {
        Err(CoreError::Unsupported { what, .. }) => assert!(what.contains("mat_mul_experts"), "{what}"),
        other => panic!("expected Unsupported, got {:?}", other.err()),
    }
}

/// gpt-oss, as llama.cpp's openai-moe.cpp reads it, from the synthetic file the goldens use
/// (tests/fixtures/synthetic/make_models.py): a sliding window on even layers only, YaRN on all
/// of them, sinks, the pre-FFN norm under its gemma name, biased experts chosen by their logits.
#[test]
fn gpt_oss_reads_its_windows_sinks_and_expert_biases() {
    use hearth_core::graph::{ExpertGating, GluActivation, Op};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/synthetic/gpt-oss-f32.gguf");
    let file = parse(&std::fs::read(path).expect("the gpt-oss fixture")).unwrap();
    let cfg = ModelConfig::from_metadata(&file.metadata).unwrap();
    let windows: Vec<Option<usize>> = cfg.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(8), None, Some(8)]);
    assert!(cfg.layers.iter().all(|l| l.rope_yarn.is_some()), "YaRN on the windowed layers too");
    assert!(cfg.attn_sinks && cfg.ffn_activation == GluActivation::GPT_OSS);
    let moe = cfg.moe.clone().expect("a MoE config");
    assert!(moe.biases && moe.routing.gating == ExpertGating::SoftmaxOfChosen && !moe.routing.normalize);

    let model =
        hearth_core::model::Model::load(&file, &mut RecordingBackend::default(), None, &mut |_, _| {}).expect("loads");
    let graph = model.build_graph(3, 1, hearth_core::graph::LogitsMode::Last);
    let attention = graph.ops.iter().filter(|op| matches!(op, Op::Attention { params, .. } if params.sinks.is_some()));
    assert_eq!(attention.count(), 3);
    let biased = graph.ops.iter().filter(|op| matches!(op, Op::MatMulExperts { bias: Some(_), .. }));
    assert_eq!(biased.count(), 9);
    assert!(graph.ops.iter().any(|op| matches!(op, Op::Glu { activation: GluActivation::GPT_OSS, .. })));
    // The expert biases count as their experts do: 2 of 4 active.
    let bias_values = 3 * (32 + 32 + 64) * 4;
    assert_eq!(model.parameters.total - model.parameters.active, (3 * 3 * 32 * 64 * 4 + bias_values) / 2);
}

/// The synthetic deepseek2 fixture's metadata, rewritten with `overrides` (no tensors).
fn deepseek2_metadata(overrides: &[(&str, Value)]) -> GgufWriter {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/synthetic/deepseek2-f32.gguf");
    let file = parse(&std::fs::read(path).expect("the deepseek2 fixture")).unwrap();
    let mut w = GgufWriter::new(3);
    for (key, value) in file.metadata.iter() {
        let value = overrides.iter().find(|(k, _)| *k == key).map_or(value, |(_, v)| v);
        w = w.kv(key, value.clone());
    }
    for (key, value) in overrides.iter().filter(|(k, _)| file.metadata.get(k).is_none()) {
        w = w.kv(key, value.clone());
    }
    w
}

/// deepseek2 as llama.cpp's deepseek2.cpp reads it: MLA from the latent rank and the logical head
/// sizes, scores scaled by the logical key size, a leading dense layer, then experts with an
/// ungated shared expert; the cache's values the latent alone; YaRN's score scale. What V3 adds
/// is refused by name rather than run wrong.
#[test]
fn deepseek2_reads_its_latent_attention_and_refuses_what_it_does_not_run() {
    use hearth_core::graph::Op;
    let file = parse(&deepseek2_metadata(&[]).write().bytes).unwrap();
    let cfg = ModelConfig::from_metadata(&file.metadata).unwrap();
    let mla = cfg.mla.expect("MLA");
    assert_eq!((mla.kv_lora, mla.qk_nope, mla.qk_rope, mla.v_head, mla.q_lora), (32, 16, 8, 16, 0));
    assert_eq!((cfg.head_dim, cfg.n_head_kv, cfg.n_dense_lead), (40, 1, 1));
    // V2-Lite's YaRN: RoPE unscaled, the scores times (1 + 0.1 · 0.707 · ln 40)².
    let yarn = cfg.layers[0].rope_yarn.expect("YaRN");
    assert!((yarn.mscale - 1.0).abs() < 1e-6, "{}", yarn.mscale);
    let kq_mscale = 1.0 + 0.1 * 0.707 * 40f32.ln();
    assert!((cfg.attn_scale - kq_mscale * kq_mscale / 24f32.sqrt()).abs() < 1e-5, "{}", cfg.attn_scale);
    let moe = cfg.moe.clone().expect("experts");
    assert!(!moe.routing.normalize && moe.routing.scale == 1.0);
    assert_eq!(moe.shared.expect("a shared expert").n_ff, 32);

    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/synthetic/deepseek2-f32.gguf");
    let whole = parse(&std::fs::read(path).unwrap()).unwrap();
    let model =
        hearth_core::model::Model::load(&whole, &mut RecordingBackend::default(), None, &mut |_, _| {}).expect("loads");
    let layout = model.kv_layout(hearth_core::kv::KvType::F16, 16, model.kv_groups());
    assert_eq!((layout.k_width, layout.v_width), (40, 32));
    // The values are the start of the key rows: a position costs its 40 keys alone per layer.
    assert_eq!(layout.values, hearth_core::kv::ValueRows::KeyPrefix);
    assert_eq!(layout.bytes_per_token(), cfg.n_layer * 40 * 2);
    layout.check_values().expect("whole blocks of the keys");
    let graph = model.build_graph(3, 1, hearth_core::graph::LogitsMode::Last);
    let count = |f: fn(&Op) -> bool| graph.ops.iter().filter(|op| f(op)).count();
    assert_eq!(count(|op| matches!(op, Op::MatMulHeads { .. })), 6);
    assert_eq!(count(|op| matches!(op, Op::RouteExperts { .. })), 2);

    let refusals: [(Vec<(&str, Value)>, &str); 3] = [
        (vec![("deepseek2.expert_gating_func", Value::U32(3))], "expert_gating_func 3"),
        // 4 experts cannot make 8 groups of at least two.
        (
            vec![("deepseek2.expert_group_count", Value::U32(8)), ("deepseek2.expert_group_used_count", Value::U32(1))],
            "expert_group_count 8",
        ),
        (vec![("deepseek2.attention.value_length", Value::U32(40))], "MLA"),
    ];
    for (overrides, refused) in refusals {
        let err = config_err(deepseek2_metadata(&overrides)).to_string();
        assert!(err.contains(refused), "{overrides:?}: {err}");
    }
}

/// DeepSeek-V3's form (tests/fixtures/synthetic/deepseek3-f32): compressed queries, a sigmoid
/// router whose probabilities plus each layer's exp_probs_b choose the experts from the best
/// groups, the weights renormalised and scaled.
#[test]
fn deepseek3_reads_its_compressed_queries_and_grouped_biased_routing() {
    use hearth_core::graph::{ExpertGating, ExpertGroups, Op};
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/synthetic/deepseek3-f32.gguf");
    let file = parse(&std::fs::read(path).unwrap()).unwrap();
    let cfg = ModelConfig::from_metadata(&file.metadata).unwrap();
    assert_eq!(cfg.mla.expect("MLA").q_lora, 24);
    let routing = cfg.moe.clone().expect("experts").routing;
    assert_eq!(routing.gating, ExpertGating::Sigmoid);
    assert_eq!(routing.groups, Some(ExpertGroups { n_group: 4, n_used: 2 }));
    assert!(routing.normalize && routing.scale == 2.5);
    let model =
        hearth_core::model::Model::load(&file, &mut RecordingBackend::default(), None, &mut |_, _| {}).expect("loads");
    let graph = model.build_graph(2, 1, hearth_core::graph::LogitsMode::Last);
    let biased = graph.ops.iter().filter(|op| {
        matches!(op, Op::RouteExperts { routing, .. } if routing.selection_bias.is_some() && routing.groups.is_some())
    });
    assert_eq!(biased.count(), 2);
}
