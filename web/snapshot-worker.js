// Makes the Pyodide snapshot for the next visit and saves it in OPFS (snapshot.js says why it
// is its own worker). worker.js starts it once its own ready is posted and ends it when it
// answers {saved: true} or {saved: false, error}.

import { loadPyodide } from "./pyodide/pyodide.mjs";
import { SNAPSHOT_IMPORTS, saveSnapshot, snapshotDir } from "./snapshot.js";

self.onmessage = async () => {
  try {
    const dir = await snapshotDir();
    if (!dir) throw new Error("no OPFS");
    const pyodide = await loadPyodide({ indexURL: new URL("./pyodide/", import.meta.url).href,
                                        _makeSnapshot: true });
    pyodide.runPython(`import importlib\nfor m in ${JSON.stringify(SNAPSHOT_IMPORTS)}:\n` +
                      "    try: importlib.import_module(m)\n    except Exception: pass");
    await saveSnapshot(dir, pyodide.makeMemorySnapshot());
    self.postMessage({ saved: true });
  } catch (e) {
    self.postMessage({ saved: false, error: `cannot make the snapshot: ${e?.message ?? e}` });
  }
};
