//! Flow-level bandwidth sharing: weighted max-min fairness by progressive filling.
//!
//! Variables v (a flow, or a whole collective) have a weight w_v, a rate bound b_v and
//! coefficients a_{v,c} on constraints c (bytes on that link per byte of progress).
//! Capacities C_c bound Σ_v a_{v,c}·r_v ≤ C_c. Progressive filling raises a common level λ
//! with r_v = w_v·λ for every unfrozen v; the first constraint to fill (least
//! remaining/Σ a·w) or bound to be reached (least b_v/w_v) freezes its variables; repeat
//! (SimGrid lmm, Bertsekas & Gallager §6.5). A heap of lazily updated fill levels (a level
//! only rises as variables freeze, so stale keys are lower bounds, re-checked when popped)
//! makes one solve O(E + P log P) for E variable–constraint elements and P pops, and stops
//! as soon as every variable is frozen.
//!
//! Incremental: a start marks its variable dirty and an end the constraints it could bind;
//! only the connected component of variables and binding-capable constraints reachable from
//! them is re-solved (SimGrid's
//! selective update; exact, because components are independent). A constraint used by one
//! variable only is folded into that variable's bound as C_c/a_{v,c} and never enters the
//! heap; a shared constraint that could not fill even with every variable at its bound
//! (Σ a·b ≤ C) cannot bind and is left out of solves and of components. Remaining bytes are
//! updated lazily: only when a variable's rate changes. Completion
//! times are rounded up to whole ns; ties are broken by variable id (creation order).
//!
//! Determinism: variables and constraints live in `Vec`s indexed by creation order; the
//! heap orders by (`total_cmp` level, kind, id); no hash container is iterated.
//!
//! Units: bytes, bytes/s, ns.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// Index of a variable, in creation order.
/// Slot of a variable; slots of ended variables are reused (ties are broken by creation
/// sequence, not by slot).
pub type VarId = u32;
/// Index of a constraint, in creation order.
pub type CnstId = u32;

#[derive(Clone, Debug)]
struct Cnst {
    /// Active variables on this constraint and their coefficients, in variable-id order.
    vars: Vec<(VarId, f64)>,
}

/// What add/remove and classification read for a constraint, in one cache line.
#[derive(Clone, Copy, Debug)]
struct Hot {
    cap: f64,
    /// Σ a·w over the active variables, kept up to date on add/remove (reset to exactly 0
    /// when the constraint empties, so rounding cannot accumulate).
    usage: f64,
    /// Σ a·bound over the active variables: the most the constraint could ever carry.
    max_load: f64,
    /// Active variables (mirror of `cnsts[c].vars.len()`).
    nvars: u32,
    class: Class,
}

/// Per-constraint solve state, kept apart from [`Cnst`] so that the per-element passes
/// touch small, dense arrays (the solver is bound by memory latency at scale).
#[derive(Clone, Copy, Debug, Default)]
struct Fill {
    remaining: f64,
    usage: f64,
    unfrozen: u32,
}

#[derive(Clone, Debug)]
struct Var {
    active: bool,
    /// Creation sequence number: the tie-break between equal completion times.
    seq: u64,
    weight: f64,
    bound: f64,
    elems: Vec<(CnstId, f64)>,
    rate: f64,
    remaining: f64,
    last_ns: u64,
    done_ns: u64,
    version: u32,
    frozen: bool,
    mark: u32,
    /// Cache, valid while `cached`: the elements on binding-capable shared constraints,
    /// and the bound folded with the variable's private constraints.
    tight: Vec<(CnstId, f64)>,
    folded_bound: f64,
    /// The private constraint that sets `folded_bound` (`u32::MAX`: the declared bound).
    fold_arg: CnstId,
    cached: bool,
}

/// What a constraint is to the solver, from its variable count and Σ a·bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Class {
    #[default]
    Empty,
    /// One variable: folded into its bound.
    Private,
    /// Shared, but cannot fill even with every variable at its bound: never binds.
    Slack,
    /// Shared and able to fill: takes part in solves and links components.
    Tight,
}

/// A heap key with a total order on the level.
#[derive(Clone, Copy, Debug)]
struct Level(f64, u8, u32, u32);

impl PartialEq for Level {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Level {}
impl PartialOrd for Level {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Level {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0).then(self.1.cmp(&o.1)).then(self.2.cmp(&o.2)).then(self.3.cmp(&o.3))
    }
}

/// Counters for benchmarks and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SolverStats {
    pub solves: u64,
    pub vars_solved: u64,
    /// Elements on binding-capable shared constraints that solves went through.
    pub elems_solved: u64,
}

/// The max-min solver with lazy progress.
#[derive(Clone, Debug, Default)]
pub struct MaxMin {
    cnsts: Vec<Cnst>,
    hot: Vec<Hot>,
    c_mark: Vec<u32>,
    c_fill: Vec<Fill>,
    vars: Vec<Var>,
    dirty: Vec<CnstId>,
    dirty_vars: Vec<VarId>,
    done: BinaryHeap<Reverse<(u64, u64, VarId, u32)>>,
    /// Slots of ended variables, reused last-in first-out (deterministic).
    free: Vec<VarId>,
    next_seq: u64,
    epoch: u32,
    pub stats: SolverStats,
}

impl MaxMin {
    pub fn new() -> MaxMin {
        MaxMin::default()
    }

    /// A constraint of capacity `cap_bytes_per_s` (> 0).
    pub fn add_constraint(&mut self, cap_bytes_per_s: f64) -> CnstId {
        assert!(cap_bytes_per_s > 0.0 && cap_bytes_per_s.is_finite(), "capacity {cap_bytes_per_s}");
        self.cnsts.push(Cnst { vars: Vec::new() });
        self.hot.push(Hot { cap: cap_bytes_per_s, usage: 0.0, max_load: 0.0, nvars: 0, class: Class::Empty });
        self.c_mark.push(0);
        self.c_fill.push(Fill::default());
        (self.cnsts.len() - 1) as CnstId
    }

    pub fn constraints(&self) -> usize {
        self.cnsts.len()
    }

    /// Adds a variable at `now_ns` with `bytes` to move, rate ≤ `bound_bytes_per_s`, and
    /// coefficients `elems` (duplicates are summed, zeros dropped). Takes effect at the next
    /// [`MaxMin::solve`].
    pub fn add_var(
        &mut self,
        now_ns: u64,
        bytes: f64,
        bound_bytes_per_s: f64,
        weight: f64,
        elems: &[(CnstId, f64)],
    ) -> VarId {
        assert!(bound_bytes_per_s > 0.0 && bound_bytes_per_s.is_finite(), "bound {bound_bytes_per_s}");
        assert!(weight > 0.0 && bytes >= 0.0);
        let mut e: Vec<(CnstId, f64)> = elems.iter().copied().filter(|&(_, a)| a > 0.0).collect();
        e.sort_by_key(|&(c, _)| c);
        e.dedup_by(|b, a| {
            if a.0 == b.0 {
                a.1 += b.1;
                true
            } else {
                false
            }
        });
        let seq = self.next_seq;
        self.next_seq += 1;
        let (id, version) = match self.free.pop() {
            Some(id) => (id, self.vars[id as usize].version.wrapping_add(1)),
            None => (self.vars.len() as VarId, 0),
        };
        for &(c, a) in &e {
            self.cnsts[c as usize].vars.push((id, a));
            let h = &mut self.hot[c as usize];
            h.nvars += 1;
            h.usage += a * weight;
            h.max_load += a * bound_bytes_per_s;
            self.reclassify(c, id);
        }
        let var = Var {
            active: true,
            seq,
            weight,
            bound: bound_bytes_per_s,
            elems: e,
            rate: 0.0,
            remaining: bytes,
            last_ns: now_ns,
            done_ns: u64::MAX,
            version,
            frozen: false,
            mark: 0,
            tight: Vec::new(),
            folded_bound: bound_bytes_per_s,
            fold_arg: u32::MAX,
            cached: false,
        };
        if id as usize == self.vars.len() {
            self.vars.push(var);
        } else {
            self.vars[id as usize] = var;
        }
        self.dirty_vars.push(id);
        id
    }

    /// Removes an active variable; its component is re-solved at the next [`MaxMin::solve`].
    /// Its slot may be handed to the next [`MaxMin::add_var`].
    pub fn remove_var(&mut self, id: VarId) {
        let v = &mut self.vars[id as usize];
        assert!(v.active, "variable {id} removed twice");
        v.active = false;
        v.version += 1;
        v.rate = 0.0;
        let (w, bound) = (v.weight, v.bound);
        // The elements are dropped: a long simulation ends millions of variables.
        let elems = std::mem::take(&mut v.elems);
        for &(c, a) in &elems {
            // Only a constraint that could bind its other variables changes their rates.
            if self.shared_and_tight(c) {
                self.dirty.push(c);
            }
            self.cnsts[c as usize].vars.retain(|&(x, _)| x != id);
            let h = &mut self.hot[c as usize];
            h.nvars -= 1;
            let empty = h.nvars == 0;
            h.usage = if empty { 0.0 } else { h.usage - a * w };
            h.max_load = if empty { 0.0 } else { h.max_load - a * bound };
            self.reclassify(c, id);
        }
        let v = &mut self.vars[id as usize];
        v.tight = Vec::new();
        v.cached = false;
        self.free.push(id);
        // Its completion entry is stale now; keep the heap's top valid for `next_completion`.
        self.clean_top();
    }

    /// Current rate of a variable, bytes/s.
    pub fn rate(&self, id: VarId) -> f64 {
        self.vars[id as usize].rate
    }

    /// Bytes left at `now_ns` (no earlier than the last solve).
    pub fn remaining(&self, id: VarId, now_ns: u64) -> f64 {
        let v = &self.vars[id as usize];
        (v.remaining - v.rate * (now_ns.saturating_sub(v.last_ns)) as f64 * 1e-9).max(0.0)
    }

    pub fn is_active(&self, id: VarId) -> bool {
        self.vars[id as usize].active
    }

    /// Re-solves the components touched since the last solve, at `now_ns`.
    pub fn solve(&mut self, now_ns: u64) {
        if self.dirty.is_empty() && self.dirty_vars.is_empty() {
            return;
        }
        let (vars, cnsts) = self.component();
        self.fill(&vars, &cnsts, now_ns);
        self.clean_top();
    }

    /// Solves every component from scratch (for tests and checks).
    pub fn solve_all(&mut self, now_ns: u64) {
        self.dirty_vars.extend((0..self.vars.len() as VarId).filter(|&v| self.vars[v as usize].active));
        self.solve(now_ns);
    }

    /// Earliest (completion ns, variable) among active variables.
    pub fn next_completion(&self) -> Option<(u64, VarId)> {
        self.done.peek().map(|Reverse((t, _, v, _))| (*t, *v))
    }

    /// Pops the variable completing at `next_completion` if it is ≤ `now_ns`; the caller
    /// removes it with [`MaxMin::remove_var`].
    pub fn pop_completed(&mut self, now_ns: u64) -> Option<VarId> {
        match self.done.peek() {
            Some(&Reverse((t, _, v, _))) if t <= now_ns => {
                self.done.pop();
                self.clean_top();
                Some(v)
            }
            _ => None,
        }
    }

    fn clean_top(&mut self) {
        while let Some(&Reverse((_, _, v, ver))) = self.done.peek() {
            let var = &self.vars[v as usize];
            if var.active && var.version == ver {
                break;
            }
            self.done.pop();
        }
    }

    /// Variables and shared constraints reachable from the dirty set, sorted by id.
    fn component(&mut self) -> (Vec<VarId>, Vec<CnstId>) {
        self.epoch = self.epoch.wrapping_add(1).max(1);
        let epoch = self.epoch;
        let mut vars = Vec::new();
        let mut cnsts = Vec::new();
        // Constraints dirtied by an end are visited whatever their class now (they could
        // bind before); from there on only tight constraints link variables.
        let mut stack_c: Vec<CnstId> = std::mem::take(&mut self.dirty);
        let mut stack_v: Vec<VarId> = std::mem::take(&mut self.dirty_vars);
        loop {
            if let Some(v) = stack_v.pop() {
                if !self.vars[v as usize].active || self.vars[v as usize].mark == epoch {
                    continue;
                }
                self.refresh(v);
                let var = &mut self.vars[v as usize];
                var.mark = epoch;
                vars.push(v);
                for &(c, _) in &var.tight {
                    if self.c_mark[c as usize] != epoch {
                        stack_c.push(c);
                    }
                }
                continue;
            }
            let Some(c) = stack_c.pop() else { break };
            if self.c_mark[c as usize] == epoch {
                continue;
            }
            self.c_mark[c as usize] = epoch;
            if self.shared_and_tight(c) {
                cnsts.push(c);
            }
            stack_v.extend(
                self.cnsts[c as usize].vars.iter().map(|&(v, _)| v).filter(|&v| self.vars[v as usize].mark != epoch),
            );
        }
        vars.sort_unstable();
        cnsts.sort_unstable();
        (vars, cnsts)
    }

    /// Progressive filling over one set of variables and their shared constraints.
    fn fill(&mut self, vars: &[VarId], cnsts: &[CnstId], now_ns: u64) {
        self.stats.solves += 1;
        self.stats.vars_solved += vars.len() as u64;
        let mut entries: Vec<Reverse<Level>> = Vec::with_capacity(vars.len() + cnsts.len());
        let mut new_rate = vec![0.0f64; vars.len()];
        for (i, &v) in vars.iter().enumerate() {
            let var = &self.vars[v as usize];
            debug_assert!(var.cached);
            let bound = var.folded_bound;
            self.stats.elems_solved += var.tight.len() as u64;
            new_rate[i] = bound; // the folded bound, until frozen
            entries.push(Reverse(Level(bound / var.weight, 1, i as u32, 0)));
        }
        for &c in cnsts {
            let c = c as usize;
            let h = &self.hot[c];
            let f = Fill { remaining: h.cap, usage: h.usage, unfrozen: h.nvars };
            self.c_fill[c] = f;
            entries.push(Reverse(Level(f.remaining / f.usage, 0, c as u32, 0)));
        }
        let mut heap = BinaryHeap::from(entries);
        for &v in vars {
            self.vars[v as usize].frozen = false;
        }
        // Keys are lower bounds of the true fill levels: freezing a variable at the current
        // level λ ≤ remaining/usage never lowers a constraint's level, so a popped key is
        // re-checked and pushed back if its level rose. Constraints that never bind are
        // never touched again, and the loop ends when every variable is frozen.
        let mut unfrozen = vars.len();
        while unfrozen > 0 {
            let Some(Reverse(Level(key, kind, id, _))) = heap.pop() else { break };
            if kind == 1 {
                let v = vars[id as usize];
                if !self.vars[v as usize].frozen {
                    self.freeze(v, new_rate[id as usize]);
                    unfrozen -= 1;
                }
                continue;
            }
            let f = self.c_fill[id as usize];
            if f.unfrozen == 0 {
                continue;
            }
            let level = f.remaining.max(0.0) / f.usage.max(f64::MIN_POSITIVE);
            if level > key {
                heap.push(Reverse(Level(level, 0, id, 0)));
                continue;
            }
            let members: Vec<VarId> = self.cnsts[id as usize]
                .vars
                .iter()
                .map(|&(v, _)| v)
                .filter(|&v| !self.vars[v as usize].frozen)
                .collect();
            for v in members {
                let i = vars.binary_search(&v).expect("component holds every variable of its constraints");
                let rate = self.vars[v as usize].weight * level;
                new_rate[i] = rate;
                self.freeze(v, rate);
                unfrozen -= 1;
            }
        }
        for (i, &v) in vars.iter().enumerate() {
            self.set_rate(v, new_rate[i], now_ns);
        }
    }

    fn freeze(&mut self, v: VarId, rate: f64) {
        let var = &mut self.vars[v as usize];
        var.frozen = true;
        let w = var.weight;
        for &(c, a) in &var.tight {
            let f = &mut self.c_fill[c as usize];
            f.remaining -= a * rate;
            f.usage -= a * w;
            f.unfrozen -= 1;
        }
    }

    /// A constraint that takes part in solves: used by two or more variables, and able to
    /// fill up (Σ a·bound > capacity). A constraint that cannot fill even with every
    /// variable at its bound never freezes anything, so leaving it out is exact; a
    /// constraint of one variable is folded into that variable's bound instead.
    fn shared_and_tight(&self, c: CnstId) -> bool {
        self.hot[c as usize].class == Class::Tight
    }

    /// Recomputes a constraint's class after a change by variable `by`; when it becomes or
    /// stops being tight, the caches of the constraint's other variables are stale.
    fn reclassify(&mut self, c: CnstId, by: VarId) {
        let cu = c as usize;
        let h = self.hot[cu];
        let class = match h.nvars {
            0 => Class::Empty,
            1 => Class::Private,
            _ if h.max_load > h.cap => Class::Tight,
            _ => Class::Slack,
        };
        let old = std::mem::replace(&mut self.hot[cu].class, class);
        // Private ⇄ Slack changes nothing a variable sees: a private constraint that
        // becomes (or was) slack has C/a ≥ the bound, so folding it never bound anyway.
        if old != class && (old == Class::Tight || class == Class::Tight) {
            let cap = h.cap;
            for &(v, a) in &self.cnsts[cu].vars {
                if v == by {
                    continue;
                }
                let var = &mut self.vars[v as usize];
                if !var.cached {
                    continue;
                }
                // Patch the cache in place rather than rebuilding it from every element.
                if old == Class::Tight
                    && let Some(i) = var.tight.iter().position(|&(x, _)| x == c)
                {
                    var.tight.remove(i);
                }
                if class == Class::Tight {
                    let i = var.tight.partition_point(|&(x, _)| x < c);
                    var.tight.insert(i, (c, a));
                }
                if old == Class::Private && var.fold_arg == c {
                    var.cached = false;
                }
                if class == Class::Private && cap / a < var.folded_bound {
                    var.folded_bound = cap / a;
                    var.fold_arg = c;
                }
            }
        }
    }

    /// Brings a variable's cache of tight elements and folded bound up to date.
    fn refresh(&mut self, v: VarId) {
        let var = &self.vars[v as usize];
        if var.cached {
            return;
        }
        let mut tight = std::mem::take(&mut self.vars[v as usize].tight);
        tight.clear();
        let var = &self.vars[v as usize];
        let (mut bound, mut arg) = (var.bound, u32::MAX);
        for &(c, a) in &var.elems {
            let h = &self.hot[c as usize];
            match h.class {
                Class::Private if h.cap / a < bound => {
                    bound = h.cap / a;
                    arg = c;
                }
                Class::Tight => tight.push((c, a)),
                _ => {}
            }
        }
        let var = &mut self.vars[v as usize];
        var.tight = tight;
        var.folded_bound = bound;
        var.fold_arg = arg;
        var.cached = true;
    }

    /// Applies a new rate: brings `remaining` up to date first (lazy update), then re-keys
    /// the completion time. An unchanged rate leaves the variable untouched.
    fn set_rate(&mut self, v: VarId, rate: f64, now_ns: u64) {
        let var = &mut self.vars[v as usize];
        if var.rate.to_bits() == rate.to_bits() && var.done_ns != u64::MAX {
            return;
        }
        let dt = now_ns.saturating_sub(var.last_ns) as f64 * 1e-9;
        var.remaining = (var.remaining - var.rate * dt).max(0.0);
        var.last_ns = now_ns;
        var.rate = rate;
        var.version = var.version.wrapping_add(1);
        var.done_ns = if var.remaining <= 0.0 {
            now_ns
        } else if rate > 0.0 {
            now_ns.saturating_add((var.remaining / rate * 1e9).ceil() as u64)
        } else {
            u64::MAX
        };
        if var.done_ns != u64::MAX {
            self.done.push(Reverse((var.done_ns, var.seq, v, var.version)));
        }
    }
}

#[cfg(test)]
mod tests;
