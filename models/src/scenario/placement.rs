//! A job's placement: which nodes of the shared cluster it runs on, in rank order.
//!
//! Three spellings: ranges `"0-7"` / `"0-3,8-11"` / `"5"`, a list `[0, 2, 4]`, or a strided
//! block `{ first = 0, count = 8, stride = 2 }` (nodes first + i · stride, i < count). Every
//! node must exist (`< cluster.nodes`) and appear once; a range or block is checked against
//! the cluster before it is expanded, so no placement allocates more than the cluster has.

/// The nodes a placement value names, checked against a cluster of `cluster_nodes` nodes.
pub(super) fn nodes(v: &toml::Value, cluster_nodes: u32) -> Result<Vec<u32>, String> {
    let max = cluster_nodes as u64;
    let node = |n: i64, what: &str| -> Result<u32, String> {
        if n < 0 || n as u64 >= max {
            return Err(format!(
                "nodes: {what} {n} is outside the shared cluster, whose nodes are 0-{}",
                max.saturating_sub(1)
            ));
        }
        Ok(n as u32)
    };
    let mut out: Vec<u32> = Vec::new();
    match v {
        toml::Value::String(s) => {
            for part in s.split(',') {
                let part = part.trim();
                let num = |x: &str| {
                    x.trim().parse::<i64>().map_err(|_| {
                        format!(
                            "nodes = \"{}\": \"{}\" is not a node or a range like 0-7",
                            super::input::short(s),
                            x.trim()
                        )
                    })
                };
                let (a, b) = match part.split_once('-') {
                    Some((a, b)) => (num(a)?, num(b)?),
                    None => (num(part)?, num(part)?),
                };
                let (a, b) = (node(a, "node")?, node(b, "node")?);
                if b < a {
                    return Err(format!("nodes: range {a}-{b} runs backwards; write {b}-{a}"));
                }
                if out.len() as u64 + (b - a) as u64 >= max {
                    return Err(format!(
                        "nodes = \"{}\" names more nodes than the cluster has ({max})",
                        super::input::short(s)
                    ));
                }
                out.extend(a..=b);
            }
        }
        toml::Value::Array(a) => {
            if a.len() as u64 > max {
                return Err(format!("nodes lists {} nodes; the shared cluster has {max}", a.len()));
            }
            for x in a {
                let n = x.as_integer().ok_or_else(|| format!("nodes = [...]: {x} is not a node index"))?;
                out.push(node(n, "node")?);
            }
        }
        toml::Value::Table(t) => {
            let get = |k: &str, default: Option<i64>| -> Result<i64, String> {
                match t.get(k) {
                    Some(v) => v.as_integer().ok_or_else(|| format!("nodes.{k} = {v}: an integer")),
                    None => {
                        default.ok_or_else(|| format!("nodes.{k} is missing: {{ first = 0, count = 8, stride = 2 }}"))
                    }
                }
            };
            if let Some(k) = t.keys().find(|k| !["first", "count", "stride"].contains(&k.as_str())) {
                return Err(format!(
                    "nodes: unknown key \"{}\"; a block has first, count, stride",
                    super::input::short(k)
                ));
            }
            let (first, count, stride) = (get("first", Some(0))?, get("count", None)?, get("stride", Some(1))?);
            if count < 1 || stride < 1 {
                return Err(format!("nodes: count = {count}, stride = {stride}: both at least 1"));
            }
            let last = first.saturating_add((count - 1).saturating_mul(stride));
            node(first, "first node")?;
            node(last, "last node (first + (count - 1) · stride)")?;
            out.extend((0..count).map(|i| (first + i * stride) as u32));
        }
        other => {
            return Err(format!("nodes = {other}: write \"0-7\", [0, 2, 4] or {{ first = 0, count = 8, stride = 2 }}"));
        }
    }
    if out.is_empty() {
        return Err("nodes is empty: a job needs at least one node".into());
    }
    let mut seen = out.clone();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("nodes: node {} is listed twice", w[0]));
    }
    Ok(out)
}
