// The two WebGPU helpers pyspec/gpu/browser.py calls once per write and once per submission.
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
