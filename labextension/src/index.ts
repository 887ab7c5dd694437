/**
 * jupyter-memprof: a "Memory profiles" side panel for JupyterLab 4.
 *
 * - The panel lists the profiles captured in the active notebook's kernel (`%%memprofile` or
 *   `jupyter_memprof.profile()`), newest first; a click opens the profile's dashboard in a
 *   main-area tab, "Release" frees it in the kernel.
 * - "Profile memory of this cell" (palette and cell context menu) runs the active cell under
 *   `%%memprofile`, loading the IPython extension first when needed, without editing the cell.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, ISessionContext, showErrorMessage } from '@jupyterlab/apputils';
import { CodeCell } from '@jupyterlab/cells';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { OutputArea } from '@jupyterlab/outputarea';
import { LabIcon } from '@jupyterlab/ui-components';
import { Panel } from '@lumino/widgets';

import { DashboardWidget } from './dashboard';
import { guardWidgetOutputs, isOurs } from './guard';
import { IProfileInfo, LinkRegistry, loadRememberedBokehJS, ProfileLink } from './link';
import { ProfilesPanel } from './panel';

const PLUGIN_ID = 'jupyter-memprof:plugin';

namespace CommandIDs {
  export const profileCell = 'jupyter-memprof:profile-cell';
  export const openPanel = 'jupyter-memprof:open-panel';
}

const memoryIcon = new LabIcon({
  name: 'jupyter-memprof:memory',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<path d="M5 7h14a1 1 0 0 1 1 1v8a1 1 0 0 1-1 1H5a1 1 0 0 1-1-1V8a1 1 0 0 1 1-1zm1 2v6h2V9H6zm4 ' +
    '0v6h2V9h-2zm4 0v6h2V9h-2zM6 4h1.5v2H6V4zm3.5 0H11v2H9.5V4zM13 4h1.5v2H13V4zm3.5 0H18v2h-1.5V4zM6 ' +
    '18h1.5v2H6v-2zm3.5 0H11v2H9.5v-2zm3.5 0h1.5v2H13v-2zm3.5 0H18v2h-1.5v-2z"/>' +
    '</g></svg>'
});

/** Loads the IPython extension unless it is already loaded (run silently before the cell). */
const LOAD_CODE =
  "get_ipython().extension_manager.loaded.__contains__('jupyter_memprof') or " +
  "get_ipython().run_line_magic('load_ext', 'jupyter_memprof')";

const MAGIC = /^\s*%%memprofile\b/;

const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';

/**
 * Whether a code cell of `notebook` has a widget among its outputs (a saved dashboard), or,
 * with `ours`, a dashboard's widget output (`isOurs`).
 */
function hasWidgetOutputs(notebook: NotebookPanel, ours = false): boolean {
  for (const cell of notebook.content.widgets) {
    if (cell instanceof CodeCell) {
      const outputs = cell.model.outputs;
      for (let i = 0; i < outputs.length; i++) {
        const output = outputs.get(i);
        if (WIDGET_MIME in output.data && (!ours || isOurs(output))) {
          return true;
        }
      }
    }
  }
  return false;
}

/**
 * Draw again every widget output of `notebook` that shows ipywidgets' error view (a view
 * that failed as it was made: jupyter_bokeh's, on a page without BokehJS). The output's
 * renderer makes a new view of the same widget; the notebook's model is not touched.
 */
function redrawFailedWidgets(notebook: NotebookPanel): void {
  for (const cell of notebook.content.widgets) {
    if (!(cell instanceof CodeCell)) {
      continue;
    }
    const area = cell.outputArea;
    for (let i = 0; i < area.model.length; i++) {
      const output = area.model.get(i);
      const child = area.widgets[i];
      if (!(WIDGET_MIME in output.data) || !child) {
        continue;
      }
      if (!child.node.querySelector('.jupyter-widgets-error-widget')) {
        continue;
      }
      const renderers = child instanceof Panel ? [...child.widgets] : [child];
      for (const r of renderers) {
        if ('renderModel' in r) {
          void (r as unknown as { renderModel(m: typeof output): Promise<void> }).renderModel(
            output
          );
        }
      }
    }
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'A side panel listing the PyTorch memory profiles captured in the kernel.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const links = new LinkRegistry();
    /** The open notebooks running the kernel of `link`. */
    const notebooksOn = (link: ProfileLink): NotebookPanel[] => {
      const out: NotebookPanel[] = [];
      tracker.forEach(notebook => {
        if (notebook.sessionContext.session?.kernel === link.kernel) {
          out.push(notebook);
        }
      });
      return out;
    };
    const panel = new ProfilesPanel(links);
    panel.title.icon = memoryIcon;
    app.shell.add(panel, 'left', { rank: 900 });
    if (restorer) {
      restorer.add(panel, panel.id);
    }

    // Dashboards: one tab per (kernel, profile); closed when the profile is released or
    // the kernel restarts.
    const dashboards = new Map<string, DashboardWidget>();
    const key = (link: ProfileLink, sid: number) => `${link.kernel.id}:${sid}`;
    // A new view opens as a tab beside the views already open (one dock area, full size
    // each), or, when none is open, in a new area to the right of the notebook.
    const place = (view: DashboardWidget): void => {
      const open = [...dashboards.values()].find(d => d !== view && !d.isDisposed && d.isAttached);
      app.shell.add(
        view,
        'main',
        open ? { mode: 'tab-after', ref: open.id } : { mode: 'split-right' }
      );
    };
    const closeWhere = (pred: (d: DashboardWidget) => boolean) => {
      for (const d of [...dashboards.values()]) {
        if (pred(d)) {
          d.dispose();
        }
      }
    };
    links.created.connect((_, link) => {
      link.released.connect((l, sid) => closeWhere(d => d.link === l && d.sids.includes(sid)));
      // The kernel accepted a comparison: open it in a tab (one per pair).
      link.compared.connect((l, { sids, summary }) => {
        const notebook = panel.notebook;
        const [a, b] = sids.map(s => l.profiles.find(p => p.sid === s));
        if (!notebook || panel.link !== l || !a || !b) {
          return;
        }
        const k = `${l.kernel.id}:${a.sid}:${b.sid}`;
        let view = dashboards.get(k);
        if (!view || view.isDisposed) {
          view = new DashboardWidget(notebook, l, a, { other: b, summary });
          place(view);
          dashboards.set(k, view);
          view.disposed.connect(() => dashboards.delete(k));
        }
        app.shell.activateById(view.id);
      });
      link.reset.connect(l => closeWhere(d => d.link === l));
      // A page without BokehJS (reloaded) whose notebooks on this kernel show widgets:
      // fetch it from the kernel, then redraw the dashboards that could not draw without it.
      link.attached.connect(l => {
        if (notebooksOn(l).some(n => hasWidgetOutputs(n))) {
          l.requestBokehJS();
        }
      });
      link.bokehLoaded.connect(l => notebooksOn(l).forEach(redrawFailedWidgets));
    });

    // Every notebook kernel gets a link, so a kernel that loads the extension while its
    // notebook is in the background is heard; the panel shows the active notebook's.
    const watch = (notebook: NotebookPanel): void => {
      guardWidgetOutputs(notebook.content.rendermime);
      // A notebook that shows dashboards (saved, or restored from a running kernel after a
      // reload): BokehJS before the widget manager makes their views.
      void notebook.context.ready.then(() => {
        if (!notebook.isDisposed && hasWidgetOutputs(notebook, true)) {
          loadRememberedBokehJS();
        }
      });
      const ctx = notebook.sessionContext;
      const onKernel = (): void => {
        const kernel = ctx.session?.kernel;
        if (kernel) {
          links.get(kernel);
        }
      };
      ctx.kernelChanged.connect(onKernel);
      notebook.disposed.connect(() => ctx.kernelChanged.disconnect(onKernel));
      onKernel();
    };
    tracker.forEach(watch);
    tracker.widgetAdded.connect((_, notebook) => watch(notebook));
    tracker.currentChanged.connect((_, notebook) => panel.follow(notebook));
    panel.follow(tracker.currentWidget);

    panel.openRequested.connect((_, info: IProfileInfo) => {
      const notebook = panel.notebook;
      const link = panel.link;
      if (!notebook || !link) {
        return;
      }
      const k = key(link, info.sid);
      let dashboard = dashboards.get(k);
      if (!dashboard || dashboard.isDisposed) {
        dashboard = new DashboardWidget(notebook, link, info);
        place(dashboard);
        dashboards.set(k, dashboard);
        dashboard.disposed.connect(() => dashboards.delete(k));
      }
      app.shell.activateById(dashboard.id);
    });

    app.commands.addCommand(CommandIDs.openPanel, {
      label: 'Show Memory Profiles',
      caption: 'Show the profiles captured in the active notebook kernel',
      execute: () => app.shell.activateById(panel.id)
    });

    app.commands.addCommand(CommandIDs.profileCell, {
      label: 'Profile memory of this cell',
      caption: 'Run the active cell under %%memprofile (loads jupyter_memprof if needed)',
      isEnabled: () => {
        const notebook = tracker.currentWidget;
        return !!notebook && notebook.content.activeCell instanceof CodeCell;
      },
      execute: async () => {
        const notebook = tracker.currentWidget;
        const cell = notebook?.content.activeCell;
        if (!notebook || !(cell instanceof CodeCell)) {
          return;
        }
        await profileCell(cell, notebook.sessionContext);
      }
    });

    if (palette) {
      palette.addItem({ command: CommandIDs.profileCell, category: 'Memory Profiler' });
      palette.addItem({ command: CommandIDs.openPanel, category: 'Memory Profiler' });
    }
    app.contextMenu.addItem({
      command: CommandIDs.profileCell,
      selector: '.jp-Notebook .jp-CodeCell',
      rank: 12
    });
  }
};

/**
 * Run `cell` under `%%memprofile` the way "Run cell" runs it (its outputs and execution count
 * land in the cell) but without touching its text: the magic is added to the code sent to the
 * kernel only. A cell that already starts with `%%memprofile` runs as it is.
 */
async function profileCell(cell: CodeCell, sessionContext: ISessionContext): Promise<void> {
  const kernel = sessionContext.session?.kernel;
  if (!kernel) {
    await showErrorMessage('No kernel', 'Start a kernel to profile this cell.');
    return;
  }
  const model = cell.model;
  const source = model.sharedModel.getSource();
  if (!source.trim()) {
    return;
  }
  const load = await kernel.requestExecute({ code: LOAD_CODE, silent: true, store_history: false })
    .done;
  if (load.content.status === 'error') {
    await showErrorMessage(
      'jupyter_memprof could not be loaded',
      `${load.content.ename}: ${load.content.evalue}`
    );
    return;
  }
  const code = MAGIC.test(source) ? source : `%%memprofile\n${source}`;
  model.sharedModel.transact(
    () => {
      model.clearExecution();
      cell.outputHidden = false;
    },
    false,
    'silent-change'
  );
  model.executionState = 'running';
  model.trusted = true;
  try {
    const reply = await OutputArea.execute(code, cell.outputArea, sessionContext, {
      ...model.metadata,
      cellId: model.sharedModel.getId()
    });
    if (reply && !cell.isDisposed) {
      model.executionCount = reply.content.execution_count;
    }
  } finally {
    if (!cell.isDisposed) {
      model.executionState = 'idle';
    }
  }
}

export default plugin;
