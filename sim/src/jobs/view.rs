//! One network under several jobs: each job's view maps its ranks onto the cluster's GPUs.
//!
//! A job's plan numbers its ranks 0..n, and the network numbers GPUs contiguously (global
//! GPU g is local GPU g mod G of node ⌊g / G⌋, G GPUs per node, [`crate::net::node`]). A job
//! placed on nodes [n₀, n₁, …] (in that order) has its rank r on GPU
//! `nodes[⌊r / G⌋] · G + r mod G`: the job's ranks keep their node-local order, so its
//! tensor-parallel groups stay on NVLink exactly as they would alone. Every view forwards to
//! the one network, whose ids are global; the view hands its job ids of its own, from 0 in
//! start order, as the engine expects.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use crate::engine::SharedNetwork;
use crate::net::{CommChoice, CommId, CommRequest, HostWork, Network};

struct Inner {
    net: Box<dyn Network>,
    /// The job and the job's id of every request in flight, by global id.
    owner: BTreeMap<CommId, (usize, CommId)>,
    /// Per job: the id its next request gets.
    next_local: Vec<CommId>,
    /// Per job: completions (when, id) found while another job's view advanced the network.
    inbox: Vec<VecDeque<(u64, CommId)>>,
}

impl Inner {
    fn advance(&mut self, now_ns: u64) -> Vec<(usize, CommId)> {
        let done = self.net.advance(now_ns);
        done.into_iter().filter_map(|g| self.owner.remove(&g)).collect()
    }
}

/// The shared network; [`Shared::view`] gives each job its own [`Network`].
pub struct Shared(Rc<RefCell<Inner>>);

impl Shared {
    pub fn new(net: Box<dyn Network>, jobs: usize) -> Shared {
        Shared(Rc::new(RefCell::new(Inner {
            net,
            owner: BTreeMap::new(),
            next_local: vec![0; jobs],
            inbox: vec![VecDeque::new(); jobs],
        })))
    }

    /// Job `job`'s view: its rank r is global GPU `gpu_of[r]`.
    pub fn view(&self, job: usize, gpu_of: Vec<u32>) -> JobNet {
        JobNet { inner: self.0.clone(), job, gpu_of }
    }
}

impl SharedNetwork for Shared {
    fn next_completion_ns(&self) -> Option<u64> {
        let inner = self.0.borrow();
        // A completion already found is due when it was found.
        let found = inner.inbox.iter().filter_map(|q| q.front().map(|&(t, _)| t)).min();
        match (found, inner.net.next_completion_ns()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn advance(&mut self, now_ns: u64) -> Vec<(usize, CommId)> {
        let mut inner = self.0.borrow_mut();
        let mut out: Vec<(usize, CommId)> = Vec::new();
        for (j, q) in inner.inbox.iter_mut().enumerate() {
            out.extend(q.drain(..).map(|(_, id)| (j, id)));
        }
        out.extend(inner.advance(now_ns));
        out
    }
}

/// One job's view of the shared network.
pub struct JobNet {
    inner: Rc<RefCell<Inner>>,
    job: usize,
    gpu_of: Vec<u32>,
}

/// The GPUs of a job on `nodes` (in order), `gpus_per_node` each: rank r's GPU.
pub fn gpus_of(nodes: &[u32], gpus_per_node: u32) -> Vec<u32> {
    nodes.iter().flat_map(|&n| (0..gpus_per_node).map(move |l| n * gpus_per_node + l)).collect()
}

impl JobNet {
    fn global(&self, req: &CommRequest) -> CommRequest {
        CommRequest { ranks: req.ranks.iter().map(|&r| self.gpu_of[r as usize]).collect(), ..req.clone() }
    }
}

impl Network for JobNet {
    fn name(&self) -> &'static str {
        self.inner.borrow().net.name()
    }

    fn start(&mut self, now_ns: u64, req: &CommRequest) -> CommId {
        let g = self.global(req);
        let mut inner = self.inner.borrow_mut();
        let global = inner.net.start(now_ns, &g);
        let local = inner.next_local[self.job];
        inner.next_local[self.job] += 1;
        inner.owner.insert(global, (self.job, local));
        local
    }

    fn next_completion_ns(&self) -> Option<u64> {
        self.inner.borrow().net.next_completion_ns()
    }

    /// Advances the shared network; the other jobs' completions wait in their inboxes for
    /// [`Shared::advance`]. (`run_jobs` advances through [`Shared`] only.)
    fn advance(&mut self, now_ns: u64) -> Vec<CommId> {
        let mut inner = self.inner.borrow_mut();
        let mut mine: Vec<CommId> = inner.inbox[self.job].drain(..).map(|(_, id)| id).collect();
        for (j, id) in inner.advance(now_ns) {
            if j == self.job {
                mine.push(id);
            } else {
                inner.inbox[j].push_back((now_ns, id));
            }
        }
        mine
    }

    fn choice(&self, req: &CommRequest) -> CommChoice {
        self.inner.borrow().net.choice(&self.global(req))
    }

    fn host_work(&self, req: &CommRequest) -> Option<HostWork> {
        self.inner.borrow().net.host_work(&self.global(req))
    }
}
