//! The workers of a process-major transport seen two ways, as transports of their own: the
//! workers of this rank's process ([`LocalView`]), and the workers of one local index across
//! the processes ([`ProcessView`]). The hierarchies ([`crate::comm::hierarchical`]) run the
//! existing algorithms unchanged on them.

use crate::comm::{CommError, SharedMemory, Transport};

/// The ranks of one local index across the processes of a process-major transport, as a
/// transport of their own: rank `i` here is rank `i * stride + offset` of the parent. Only
/// those ranks may use it. The leader hierarchy's view is offset 0 (the leaders); the 2-D
/// hierarchy's worker `j` uses offset `j` (the owners of shard `j`).
pub struct ProcessView<'a> {
    /// The transport over every worker.
    pub parent: &'a dyn Transport,
    /// Workers per process.
    pub stride: usize,
    /// The local index this view connects.
    pub offset: usize,
}

impl Transport for ProcessView<'_> {
    fn rank(&self) -> usize {
        self.parent.rank() / self.stride
    }

    fn world(&self) -> usize {
        self.parent.world() / self.stride
    }

    fn send(&self, to: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
        self.parent.send(to * self.stride + self.offset, tag, data)
    }

    fn recv(&self, from: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError> {
        self.parent.recv(from * self.stride + self.offset, tag, out)
    }

    fn round_to_wire(&self, buf: &mut [f32]) -> Result<(), CommError> {
        self.parent.round_to_wire(buf)
    }
}

/// The workers of this rank's process of a process-major transport, as a transport of their
/// own: rank `i` here is rank `first + i` of the parent.
pub struct LocalView<'a> {
    /// The transport over every worker.
    pub parent: &'a dyn Transport,
    /// Workers per process.
    pub size: usize,
}

impl LocalView<'_> {
    fn first(&self) -> usize {
        self.parent.rank() - self.parent.rank() % self.size
    }
}

impl Transport for LocalView<'_> {
    fn rank(&self) -> usize {
        self.parent.rank() % self.size
    }

    /// The parent's group, when it is exactly this process's workers (a multi-process
    /// transport's, or a one-process fabric's).
    fn shared_memory(&self) -> Option<SharedMemory<'_>> {
        self.parent
            .shared_memory()
            .filter(|shm| shm.world() == self.size && shm.rank == self.rank())
    }

    fn world(&self) -> usize {
        self.size
    }

    fn send(&self, to: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
        self.parent.send(self.first() + to, tag, data)
    }

    fn recv(&self, from: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError> {
        self.parent.recv(self.first() + from, tag, out)
    }

    fn round_to_wire(&self, buf: &mut [f32]) -> Result<(), CommError> {
        self.parent.round_to_wire(buf)
    }
}
