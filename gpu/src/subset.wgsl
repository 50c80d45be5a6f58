// Bloom subset match: conjunction i is a candidate for object o iff
// filters[i] & !objects[o] == 0, word by word.
//
// Filters are word-major (32-bit word w of every conjunction of this chunk contiguous) so a
// workgroup's loads of one word are coalesced; each invocation loads its conjunction's filter
// once and tests it against every object of the batch. Matches are appended as (object,
// conjunction) pairs with an atomic counter; the counter keeps counting past the capacity so
// the host detects overflow and runs again with a larger buffer: nothing is silently dropped.

struct Params {
    n: u32,          // conjunctions in this chunk
    first: u32,      // global index of the chunk's first conjunction
    n_obj: u32,      // objects in the batch
    words: u32,      // 32-bit words per filter
    capacity: u32,   // pairs the output can hold
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> filters: array<u32>;
@group(0) @binding(2) var<storage, read> objects: array<u32>;
@group(0) @binding(3) var<storage, read_write> count: atomic<u32>;
@group(0) @binding(4) var<storage, read_write> pairs: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= params.n) {
        return;
    }
    var f: array<u32, 32>;
    for (var w = 0u; w < params.words; w = w + 1u) {
        f[w] = filters[w * params.n + i];
    }
    for (var o = 0u; o < params.n_obj; o = o + 1u) {
        var miss = 0u;
        let base = o * params.words;
        for (var w = 0u; w < params.words; w = w + 1u) {
            miss = miss | (f[w] & ~objects[base + w]);
        }
        if (miss == 0u) {
            let slot = atomicAdd(&count, 1u);
            if (slot < params.capacity) {
                pairs[2u * slot] = o;
                pairs[2u * slot + 1u] = params.first + i;
            }
        }
    }
}
