//! The wgpu Bloom subset-match kernel and its CPU twin. Not built yet: the GPU issue fills it.
