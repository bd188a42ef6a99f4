// Makes the Pyodide snapshot and the bytecode cache for the next visit and saves them in OPFS
// (snapshot.js says why it is its own worker). worker.js starts it once its own ready is posted,
// sends {snapshot: whether one is needed, wheels: [{sha256}], data: [Uint8Array]} (the wheels
// it unpacked, already checked) and
// ends it when it answers {saved: true} or {saved: false, error}.

import { loadPyodide } from "./pyodide/pyodide.mjs";
import { CACHED_PACKAGES, SNAPSHOT_IMPORTS, saveBytecode, saveSnapshot, snapshotDir }
  from "./snapshot.js";

// Compile the cached packages' modules (unchecked-hash .pyc) and zip the __pycache__ folders.
const COMPILE = `
import compileall, io, os, py_compile, sysconfig, zipfile
site = sysconfig.get_path("purelib")
unchecked = py_compile.PycInvalidationMode.UNCHECKED_HASH
out = io.BytesIO()
with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
    for top in ${JSON.stringify(CACHED_PACKAGES)}:
        compileall.compile_dir(os.path.join(site, top), quiet=2, invalidation_mode=unchecked)
        for folder, _, files in os.walk(os.path.join(site, top)):
            if os.path.basename(folder) == "__pycache__":
                for f in files:
                    z.write(os.path.join(folder, f), os.path.relpath(os.path.join(folder, f), site))
out.getvalue()
`;

self.onmessage = async ({ data: { snapshot, wheels, data } }) => {
  try {
    const dir = await snapshotDir();
    if (!dir) throw new Error("no OPFS");
    const pyodide = await loadPyodide({ indexURL: new URL("./pyodide/", import.meta.url).href,
                                        _makeSnapshot: snapshot });
    if (snapshot) {
      pyodide.runPython(`import importlib\nfor m in ${JSON.stringify(SNAPSHOT_IMPORTS)}:\n` +
                        "    try: importlib.import_module(m)\n    except Exception: pass");
      await saveSnapshot(dir, pyodide.makeMemorySnapshot());
    }
    // The snapshot is taken: this Python may go on to unpack the wheels and compile them.
    const site = pyodide.runPython("import sysconfig\nsysconfig.get_path('purelib')");
    for (const bytes of data) pyodide.unpackArchive(bytes, "zip", { extractDir: site });
    const zipped = pyodide.runPython(COMPILE);
    const bytes = zipped.toJs();
    zipped.destroy();
    await saveBytecode(dir, wheels, bytes);
    self.postMessage({ saved: true });
  } catch (e) {
    self.postMessage({ saved: false, error: `cannot make the snapshot: ${e?.message ?? e}` });
  }
};
