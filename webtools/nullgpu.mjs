// A WebGPU that computes nothing, for timing what is ours in the page's cycle (webtools/dawn.mjs
// --null-gpu): the worker, Pyodide, the Python session and web/webgpu.js run exactly as in the
// browser, every WebGPU call is answered at once and does nothing, and every readback maps
// `token` from its fifth word on (the first four zero). What a cycle then costs is the page's own host work: Python encoding the cycle, the
// crossings into JavaScript (writes, the submission's op words, the readback's map and copy),
// the event loop's hops between them, and the worker's chunk messages. The tokens are
// meaningless (the accept words read back say: no draft accepted, emit `token`; the emitted
// tokens start at word 4, pyspec/gpu/constants.py ACCEPT_TOKENS), so only the timing is worth reading; a draft model still runs its device path, each
// step's dispatches recorded into the one submission.
//
// Shaped like the npm `webgpu` package's export: create() gives a navigator.gpu, `globals` the
// GPU* constants a browser defines.

const LIMITS = {
  maxBufferSize: 2 ** 31, maxStorageBufferBindingSize: 2 ** 31 - 4,
  maxComputeWorkgroupStorageSize: 32768, maxStorageBuffersPerShaderStage: 10,
};

export const globals = {
  GPUBufferUsage: { MAP_READ: 1, MAP_WRITE: 2, COPY_SRC: 4, COPY_DST: 8, INDEX: 16, VERTEX: 32,
                    UNIFORM: 64, STORAGE: 128, INDIRECT: 256, QUERY_RESOLVE: 512 },
  GPUMapMode: { READ: 1, WRITE: 2 },
};

// What the cycle's submissions cost JavaScript: counted, for the report.
export const counts = { writes: 0, submits: 0, dispatches: 0, copies: 0, maps: 0 };

function buffer(desc, token) {
  return {
    size: desc.size, label: desc.label ?? "",
    async mapAsync() { counts.maps++; },
    getMappedRange(offset = 0, size) {
      if (offset + size > desc.size) throw new Error("OperationError: range past the mapping");
      const out = new ArrayBuffer(size ?? desc.size - offset);
      new Uint32Array(out, 0, out.byteLength >> 2).fill(token, 4);
      return out;
    },
    unmap() {}, destroy() {},
  };
}

function device(token) {
  const pass = { setPipeline() {}, setBindGroup() {}, end() {},
                 dispatchWorkgroups() { counts.dispatches++; } };
  return {
    limits: { ...LIMITS }, features: new Set(), label: "null",
    lost: new Promise(() => {}),
    queue: { writeBuffer() { counts.writes++; }, submit() { counts.submits++; },
             onSubmittedWorkDone: async () => {} },
    addEventListener() {}, pushErrorScope() {}, popErrorScope: async () => null,
    createBuffer: (desc) => buffer(desc, token),
    createShaderModule: () => ({ getCompilationInfo: async () => ({ messages: [] }) }),
    createComputePipeline: () => ({ getBindGroupLayout: () => ({}) }),
    createBindGroup: () => ({}),
    createCommandEncoder: () => ({ beginComputePass: () => pass, finish: () => ({}),
                                   copyBufferToBuffer() { counts.copies++; } }),
    destroy() {},
  };
}

export function create(token = 100) {
  const adapter = {
    info: { vendor: "null", architecture: "", device: "null", description: "null GPU (computes nothing)",
            isFallbackAdapter: false },
    limits: LIMITS, features: new Set(),
    requestDevice: async () => device(token),
  };
  return { requestAdapter: async () => adapter };
}
