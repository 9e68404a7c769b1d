//! In-process communicator: one thread per rank, one channel per rank.
//!
//! Rank r owns the receiving end of channel r; every rank holds a sender to every channel.
//! A send is a channel push (it never waits for the receiver). Failure is shared through an
//! [`AbortFlag`]: the first rank (or the driver) that sets it names the failed rank, and
//! every receive sees it within one polling slice ([`POLL`]).

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{CommError, Communicator, Message, Payload, Tag};

/// How often a waiting receive looks at the abort flag.
pub const POLL: Duration = Duration::from_millis(20);

/// The first failure of a job: (rank, reason). Shared by every rank and the driver.
#[derive(Clone, Debug, Default)]
pub struct AbortFlag(Arc<Mutex<Option<(u32, String)>>>);

impl AbortFlag {
    /// Records a failure unless one is already recorded (the first one is the cause).
    pub fn set(&self, rank: u32, reason: &str) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some((rank, reason.to_string()));
        }
    }

    pub fn get(&self) -> Option<(u32, String)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// One rank's end of an in-process job.
pub struct ThreadComm {
    rank: u32,
    senders: Vec<Sender<Message>>,
    rx: Receiver<Message>,
    abort: AbortFlag,
}

impl ThreadComm {
    /// Communicators for `ranks` ranks sharing `abort`; element r is rank r's.
    pub fn group(ranks: u32, abort: &AbortFlag) -> Vec<ThreadComm> {
        assert!(ranks > 0, "a job needs at least one rank");
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..ranks).map(|_| channel()).unzip();
        receivers
            .into_iter()
            .enumerate()
            .map(|(r, rx)| ThreadComm { rank: r as u32, senders: senders.clone(), rx, abort: abort.clone() })
            .collect()
    }

    fn aborted(&self) -> Result<(), CommError> {
        match self.abort.get() {
            Some((rank, reason)) => Err(CommError::RankFailed { rank, reason }),
            None => Ok(()),
        }
    }
}

impl Communicator for ThreadComm {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn size(&self) -> u32 {
        self.senders.len() as u32
    }

    fn send(&self, to: u32, tag: Tag, payload: Payload) -> Result<(), CommError> {
        assert!(to != self.rank && to < self.size(), "rank {} sends to rank {to} of {}", self.rank, self.size());
        self.aborted()?;
        self.senders[to as usize]
            .send(Message { from: self.rank, tag, payload })
            .map_err(|_| CommError::PeerGone { rank: to })
    }

    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, CommError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.aborted()?;
            // A message already waiting is taken at once, even with a zero timeout (a drain).
            let now = Instant::now();
            let got = if now >= deadline {
                match self.rx.try_recv() {
                    Ok(m) => Ok(m),
                    Err(TryRecvError::Empty) => return Ok(None),
                    Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
                }
            } else {
                self.rx.recv_timeout(POLL.min(deadline - now))
            };
            match got {
                Ok(Message { from, tag: Tag::Abort, payload }) => {
                    let reason = match payload {
                        Payload::Text(t) => t,
                        _ => "aborted".to_string(),
                    };
                    self.abort.set(from, &reason);
                    return Err(CommError::RankFailed { rank: from, reason });
                }
                Ok(m) => return Ok(Some(m)),
                Err(RecvTimeoutError::Timeout) => {}
                // Every sender lives in this struct too, so the channel cannot disconnect.
                Err(RecvTimeoutError::Disconnected) => unreachable!("rank {} holds a sender to itself", self.rank),
            }
        }
    }

    fn abort(&self, reason: &str) {
        self.abort.set(self.rank, reason);
        for (to, s) in self.senders.iter().enumerate() {
            if to as u32 != self.rank {
                let _ =
                    s.send(Message { from: self.rank, tag: Tag::Abort, payload: Payload::Text(reason.to_string()) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_arrive_and_aborts_name_the_rank() {
        let flag = AbortFlag::default();
        let comms = ThreadComm::group(3, &flag);
        let tag = Tag::Control { step: 0, what: 1 };
        comms[0].send(2, tag, Payload::F32(vec![1.0, 2.0])).unwrap();
        let m = comms[2].recv_timeout(Duration::from_secs(1)).unwrap().unwrap();
        assert_eq!((m.from, m.tag, m.payload), (0, tag, Payload::F32(vec![1.0, 2.0])));
        assert_eq!(comms[1].recv_timeout(Duration::from_millis(30)).unwrap(), None);
        // A message already there is taken even with a zero timeout (what a drain relies on).
        comms[0].send(1, tag, Payload::Empty).unwrap();
        assert_eq!(comms[1].recv_timeout(Duration::ZERO).unwrap().map(|m| m.from), Some(0));
        assert_eq!(comms[1].recv_timeout(Duration::ZERO).unwrap(), None);
        comms[1].abort("injected");
        let e = comms[0].recv_timeout(Duration::from_secs(1)).unwrap_err();
        assert_eq!(e, CommError::RankFailed { rank: 1, reason: "injected".into() });
        assert!(comms[2].send(0, tag, Payload::Empty).is_err(), "sends after an abort fail");
    }
}
