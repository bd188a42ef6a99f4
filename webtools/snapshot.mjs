// The Pyodide snapshot shipped with the site (web/snapshot.js says what it is): Node starts the
// site's own Pyodide with `_makeSnapshot`, imports the same standard-library modules as
// web/snapshot-worker.js, and writes sha256(memory) + memory, the format OPFS holds.
//
//   node webtools/snapshot.mjs SITE/pyodide/ OUT
//
// Why Node: the build has it (build.py setup installs npm for the tests), and a snapshot holds
// no trace of where it was made that the page would meet: Pyodide checks its build id, and the
// JS objects Python held are found again by name (jsglobals paths) in the worker. The e2e tests
// start every page from this file.
import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { SNAPSHOT_IMPORTS } from "../web/snapshot.js";

const [indexDir, out] = process.argv.slice(2);
const { loadPyodide } = await import(pathToFileURL(`${indexDir}/pyodide.mjs`).href);
const pyodide = await loadPyodide({ indexURL: indexDir.endsWith("/") ? indexDir : `${indexDir}/`,
                                    _makeSnapshot: true });
pyodide.runPython(`import importlib\nfor m in ${JSON.stringify(SNAPSHOT_IMPORTS)}:\n` +
                  "    try: importlib.import_module(m)\n    except Exception: pass");
const memory = pyodide.makeMemorySnapshot();
const digest = createHash("sha256").update(memory).digest();
writeFileSync(out, Buffer.concat([digest, memory]));
