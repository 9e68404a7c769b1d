//! The fuzz generator: seeded mutations of the corpus (the shipped scenarios, the scenarios
//! and plan files in `tests/fuzz/corpus/`).
//!
//! A scenario case is a base file plus one to four `--set KEY=VALUE` overrides (every key a
//! scenario can hold; random, boundary, extreme, negative, wrong-type and huge values,
//! and small perturbations so that many cases stay valid and reach the simulator), or a
//! text mutation of the file itself (truncation, a garbage or a huge line, a duplicated
//! line). A plan case is a corpus plan with one JSON value replaced (an extreme number, a
//! wrong type, a removed field). Everything follows from the seed.

use serde_json::Value;

/// SplitMix64: a small, seeded, platform-independent generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Every key of a scenario, with the kind of value it holds.
pub const KEYS: &[(&str, Kind)] = &[
    ("model.preset", Kind::Name(&["gpt2-124m", "gpt3-175b", "llama3-8b", "llama3-405b", "tiny-gpt", "tiny-llama"])),
    ("model.family", Kind::Name(&["gpt", "llama"])),
    ("model.layers", Kind::Int),
    ("model.hidden", Kind::Int),
    ("model.heads", Kind::Int),
    ("model.kv_heads", Kind::Int),
    ("model.ffn_hidden", Kind::Int),
    ("model.vocab", Kind::Int),
    ("model.seq_len", Kind::Int),
    ("model.activation", Kind::Name(&["gelu", "swiglu"])),
    ("model.dropout", Kind::Real),
    ("cluster.preset", Kind::Name(&["dgx-a100", "dgx-h100", "dgx-b200", "aws-p4d", "cpu-local"])),
    ("cluster.gpu", Kind::Name(&["a100-80gb", "h100-sxm", "h200-sxm", "b200", "cpu"])),
    ("cluster.nodes", Kind::Int),
    ("cluster.gpus_per_node", Kind::Int),
    ("cluster.nics_per_node", Kind::Int),
    ("cluster.nic_gbps", Kind::Real),
    ("cluster.fabric", Kind::Name(&["single-switch", "fat-tree", "rail-optimized", "leaf-spine"])),
    ("cluster.oversubscription", Kind::Real),
    ("cluster.routing", Kind::Name(&["adaptive", "static"])),
    ("cluster.switch_radix", Kind::Int),
    ("cluster.nodes_per_unit", Kind::Int),
    ("cluster.switch_latency_ns", Kind::Int),
    ("cluster.nic_efficiency", Kind::Real),
    ("parallel.tp", Kind::Int),
    ("parallel.pp", Kind::Int),
    ("parallel.dp", Kind::Int),
    ("parallel.vpp", Kind::Int),
    ("parallel.schedule", Kind::Name(&["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"])),
    ("parallel.micro_batch", Kind::Int),
    ("parallel.global_batch", Kind::Int),
    ("parallel.zero", Kind::Int),
    ("parallel.recompute", Kind::Name(&["none", "selective", "full"])),
    ("parallel.sequence_parallel", Kind::Bool),
    ("parallel.grad_bucket_mb", Kind::Real),
    ("parallel.overlap_grad_reduce", Kind::Bool),
    ("parallel.overlap_param_gather", Kind::Bool),
    ("parallel.moe_a2a_overlap", Kind::Bool),
    ("training.dtype", Kind::Name(&["bf16", "fp16", "fp32"])),
    ("training.steps", Kind::Int),
    ("training.seed", Kind::Int),
    ("training.lr", Kind::Real),
    ("training.warmup_steps", Kind::Int),
    ("training.weight_decay", Kind::Real),
    ("training.grad_clip", Kind::Real),
    ("training.flash_attention", Kind::Bool),
];

#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Int,
    Real,
    Bool,
    Name(&'static [&'static str]),
}

/// A value that is of the wrong type, or huge, or nonsense, whatever the key.
fn wild(rng: &mut Rng) -> String {
    match rng.below(9) {
        0 => "\"abc\"".into(),
        1 => "true".into(),
        2 => "[1, 2]".into(),
        3 => "{ a = 1 }".into(),
        4 => format!("\"{}\"", "x".repeat(rng.below(200_000) as usize)),
        5 => "\"\"".into(),
        6 => "1979-05-27".into(),
        7 => "nan".into(),
        _ => "-inf".into(),
    }
}

fn int(rng: &mut Rng) -> String {
    let small = [0i128, 1, 2, 3, 4, 6, 7, 8, 12, 16, 24, 32, 64, 96, 128, 1000, 4096, 4097, 65536];
    match rng.below(10) {
        0..=3 => rng.pick(&small).to_string(),
        4 => (1 + rng.below(64)).to_string(),
        5 => {
            let k = rng.below(64) as u32;
            let off = *rng.pick(&[-1i128, 0, 1]);
            ((1i128 << k) + off).to_string()
        }
        6 => rng
            .pick(&[-1i128, -2, i64::MIN as i128, u32::MAX as i128, u32::MAX as i128 + 1, i64::MAX as i128])
            .to_string(),
        7 => rng.below(u32::MAX as u64).to_string(),
        8 => rng.pick(&["1e6", "1.5", "100000", "131072", "1048576", "2147483648"]).to_string(),
        _ => wild(rng),
    }
}

fn real(rng: &mut Rng) -> String {
    let v = [
        "0.0", "-0.0", "5e-324", "1e-15", "1e-3", "0.001", "0.5", "1.0", "1.5", "2.0", "4.0", "100.0", "400.0", "1e6",
        "1e308", "inf", "-inf", "nan", "-1.0", "0.1", "0.99", "1e-300", "3", "200", "1024", "1025.0",
    ];
    match rng.below(10) {
        0..=7 => rng.pick(&v).to_string(),
        8 => format!("{:e}", f64::from_bits(rng.next())),
        _ => wild(rng),
    }
}

/// A value the key could well hold: most cases then pass validation and reach the planner
/// and the simulator, where the interesting bugs are.
fn plausible(rng: &mut Rng, kind: Kind) -> String {
    match kind {
        Kind::Int => rng
            .pick(&["0", "1", "1", "2", "2", "3", "4", "4", "6", "8", "8", "16", "32", "64", "128", "256"])
            .to_string(),
        Kind::Real => rng
            .pick(&["0.001", "0.1", "0.5", "1.0", "1.0", "2.0", "4.0", "10.0", "200.0", "400.0", "1600.0"])
            .to_string(),
        Kind::Bool => rng.pick(&["true", "false"]).to_string(),
        Kind::Name(names) => rng.pick(names).to_string(),
    }
}

/// One `KEY=VALUE` override; `wild` asks for an extreme or wrong one.
pub fn override_spec(rng: &mut Rng, extreme: bool) -> String {
    let (key, kind) = *rng.pick(KEYS);
    if !extreme {
        return format!("{key}={}", plausible(rng, kind));
    }
    let value = if rng.chance(3) {
        wild(rng)
    } else {
        match kind {
            Kind::Int => int(rng),
            Kind::Real => real(rng),
            Kind::Bool => rng.pick(&["true", "false", "1", "yes"]).to_string(),
            Kind::Name(names) => {
                if rng.chance(85) {
                    rng.pick(names).to_string()
                } else {
                    rng.pick(&["GPT", "dgx-h1000", "zb-h3", "none ", "\"\""]).to_string()
                }
            }
        }
    };
    // Now and then an unknown key or a broken spec.
    match rng.below(40) {
        0 => format!("model.layer={value}"),
        1 => key.to_string(),
        2 => format!("{key}.deeper={value}"),
        3 => format!("=.{value}"),
        _ => format!("{key}={value}"),
    }
}

/// A text mutation of a scenario file.
pub fn mutate_text(rng: &mut Rng, text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let at = rng.below(lines.len() as u64 + 1) as usize;
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    match rng.below(6) {
        0 => {
            let cut = rng.below(text.len() as u64 + 1) as usize;
            return text.char_indices().take_while(|(i, _)| *i < cut).map(|(_, c)| c).collect();
        }
        1 => out.insert(at, "x".repeat(1 + rng.below(300_000) as usize)),
        2 => out.insert(at, format!("junk = [{}", "1,".repeat(rng.below(50_000) as usize))),
        3 if !lines.is_empty() => {
            let l = out[rng.below(out.len() as u64) as usize].clone();
            out.insert(at, l);
        }
        4 => out.insert(at, "[model]\nlayers = 2".into()),
        _ => out.insert(at, "\u{0}\u{7f}\u{feff}ÿ = \"é".into()),
    }
    out.join("\n")
}

/// JSON pointers of every leaf (and every object member) of a plan, for mutation.
pub fn leaves(v: &Value, path: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                leaves(x, format!("{path}/{}", k.replace('~', "~0").replace('/', "~1")), out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                leaves(x, format!("{path}/{i}"), out);
            }
        }
        _ => out.push(path),
    }
}

/// One value of a plan replaced.
pub fn mutate_plan(rng: &mut Rng, plan: &Value, paths: &[String]) -> Value {
    let mut v = plan.clone();
    for _ in 0..1 + rng.below(3) {
        let path = rng.pick(paths);
        let Some(slot) = v.pointer_mut(path) else { continue };
        *slot = match rng.below(12) {
            0 => Value::from(0),
            1 => Value::from(u32::MAX),
            2 => Value::from(u64::MAX),
            3 => Value::from(-1),
            4 => Value::from(1u64 << 40),
            5 => Value::from(5e-324),
            6 => Value::from(1e300),
            7 => Value::String("x".into()),
            8 => Value::Null,
            9 => Value::from(rng.below(8)),
            10 => match &*slot {
                Value::Number(n) => Value::from(n.as_u64().map_or(1, |x| x.saturating_add(1))),
                other => other.clone(),
            },
            _ => Value::from(rng.below(1 << 20)),
        };
    }
    v
}
