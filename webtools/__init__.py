"""Build-time tools for the browser runtime: the static site, its server, headless Chromium.

Not part of the pyspec wheel (nothing here runs in the browser). `build.py` calls these with the
venv's Python:
  site.py     builds dist/site/: Pyodide + verified wheels, the pyspec wheel, web/, models, manifest
  errorcodes.py  the SpecError codes, read from pyspec/ and web/, as client.d.ts's union
  serve.py    a static server with the right MIME types and cross-origin isolation headers
  browser.py  launches Debian's Chromium with WebGPU (SwiftShader) through Playwright, and runs
              the demo page headless (`python3 build.py demo --headless`)
  screenshot.py  the README's and docs/faults.md's pictures of the demo page
"""
