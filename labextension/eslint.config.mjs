// ESLint for the dashboard's browser code, which ships with the Python package
// (jupyter_memprof/_views/js); `make lint` runs it from the repository root. Most files are
// Bokeh CustomJS bodies: function bodies (a top-level `return` is allowed) whose free names
// are declared in their own `/* global ... */` comment. units.js, prelude.js and
// notebook_loader.js are put in front of other code and declare what they export.
import js from "@eslint/js";

const DIR = "jupyter_memprof/_views/js";
const LIBRARIES = [`${DIR}/units.js`, `${DIR}/prelude.js`, `${DIR}/notebook_loader.js`];

const common = {
  ...js.configs.recommended,
  languageOptions: {
    ecmaVersion: 2022,
    sourceType: "script",
    globals: {
      window: "readonly",
      document: "readonly",
      performance: "readonly",
      requestAnimationFrame: "readonly",
      DecompressionStream: "readonly",
      Blob: "readonly",
      Response: "readonly",
      atob: "readonly",
    },
  },
  linterOptions: { reportUnusedDisableDirectives: "error" },
  rules: {
    ...js.configs.recommended.rules,
    eqeqeq: "error",
    "no-implied-eval": "error",
    "no-var": "error",
    "prefer-const": "error",
  },
};

export default [
  { ...common, files: LIBRARIES },
  {
    ...common,
    files: [`${DIR}/*.js`],
    ignores: LIBRARIES,
    languageOptions: {
      ...common.languageOptions,
      parserOptions: { ecmaFeatures: { globalReturn: true } },
    },
  },
];
