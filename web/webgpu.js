// The WebGPU helpers pyspec/gpu/browser.py calls once per write, once per submission and once
// per readback.
// worker.js registers this module in Pyodide as `pyspec_webgpu`. They live in a file, not in
// strings that Python evaluates, so the runtime needs no 'unsafe-eval' in its
// Content-Security-Policy (webtools/package.py states the policy; e2e tests run under it).

// Why a JS helper: a Uint8Array view of wasm memory is invalidated if the memory grows, which
// any Python allocation may cause. Taking the view and writing it in one JS function leaves no
// Python step in between. `data` arrives as a PyProxy of a 1-D uint8 memoryview.
export function writeBuffer(queue, buffer, offset, data) {
  const view = data.getBuffer("u8");
  try { queue.writeBuffer(buffer, offset, view.data); } finally { view.release(); }
}

// The submission loop (Device.submit's rules: consecutive dispatches share a compute pass, a copy
// ends it, a pipeline is set only when it changes), over op words of 6 u32 each:
//   0 pipeline bind_group x y z              a dispatch (indices into `objs`)
//   1 src src_offset dst dst_offset nbytes   a buffer copy
export function encode(device, queue, objs, words) {
  const view = words.getBuffer("u32");
  try {
    const w = view.data, encoder = device.createCommandEncoder();
    let pass = null, last = -1;
    for (let i = 0; i < w.length; i += 6) {
      if (w[i] === 0) {
        if (pass === null) { pass = encoder.beginComputePass(); last = -1; }
        if (w[i + 1] !== last) { last = w[i + 1]; pass.setPipeline(objs[last]); }
        pass.setBindGroup(0, objs[w[i + 2]]);
        pass.dispatchWorkgroups(w[i + 3], w[i + 4], w[i + 5]);
      } else {
        if (pass !== null) { pass.end(); pass = null; }
        encoder.copyBufferToBuffer(objs[w[i + 1]], w[i + 2], objs[w[i + 3]], w[i + 4], w[i + 5]);
      }
    }
    if (pass !== null) pass.end();
    queue.submit([encoder.finish()]);
  } finally { view.release(); }
}

// A readback in one call (browser.py's _map_read): map `staging`'s first `size` bytes, copy the
// first `nbytes` out (into JavaScript memory, not the wasm heap: any Python allocation may grow
// and move that), unmap. Python then makes one more call, to take the bytes: two crossings where
// mapAsync, GPUMapMode, getMappedRange, a Uint8Array, its copy and unmap were six or more, and
// the watchdog's timer is here, so the await needs no Python timer either. It rejects with an
// Error named "PyspecTimeout" after `timeoutMs`. The drills (gpu/device.py's DEVICE_DRILLS):
// "readback-hang" waits on a map that never settles, as a hung GPU process would;
// "readback-throw" asks for more than was mapped, and WebGPU throws (OperationError), as a wrong
// offset would.
export function readBuffer(staging, size, nbytes, timeoutMs, drill) {
  let timer = null;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error(
      `no answer in ${timeoutMs} ms`), { name: "PyspecTimeout" })), timeoutMs);
  });
  const mapped = drill === "readback-hang" ? new Promise(() => {})
    : staging.mapAsync(GPUMapMode.READ, 0, size);
  mapped.catch(() => {});   // a map given up on (its buffer destroyed) rejects unwatched
  const read = mapped.then(() => {
    try {
      const end = drill === "readback-throw" ? size + 4096 : size;
      return new Uint8Array(staging.getMappedRange(0, end), 0, nbytes).slice();
    } finally {
      staging.unmap();
    }
  });
  return Promise.race([read, expired]).finally(() => clearTimeout(timer));
}
