/**
 * A notebook's dashboards whose widgets its kernel does not have (the notebook saved, then
 * opened with a new kernel): a short note in their place, instead of ipywidgets' "Error
 * displaying widget: model not found" and an error in the browser console for each.
 *
 * The widget outputs of the notebook's rendermime are still drawn by ipywidgets' renderer;
 * its `renderModel` is wrapped for jupyter_memprof's outputs only (marked by the kernel, see
 * `isOurs`): it waits for the notebook's widget manager to have restored the kernel's
 * widgets, then draws the output if the kernel has its widget (with BokehJS put into the
 * page first, when the browser keeps a copy), or writes the note.
 */

import { IRenderMimeRegistry, IRenderMime } from '@jupyterlab/rendermime';

import { hasBokehJS, loadRememberedBokehJS } from './link';

export const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';

/** The note shown in place of a dashboard whose widget is not in the kernel. */
export const GONE_NOTE = 'The dashboard is not in this kernel: run the cell again to draw it.';

/** What the guard needs of ipywidgets' widget manager (public methods of ManagerBase). */
interface IWidgetManager {
  has_model(id: string): boolean;
  restoredStatus?: boolean;
  restored?: { connect(fn: () => void): void; disconnect(fn: () => void): void };
}

/** ipywidgets' renderer: its manager arrives later, through a promise it keeps. */
interface IWidgetRenderer extends IRenderMime.IRenderer {
  _manager?: { promise: Promise<IWidgetManager> };
  __memprofGuarded?: boolean;
}

/**
 * An output `display_with_bokehjs` made (`_views/dashboard/html.py`): marked in its metadata,
 * or, in notebooks saved before the mark, a widget view with an empty text form.
 */
export function isOurs(model: IRenderMime.IMimeModel): boolean {
  const meta = model.metadata as Record<string, unknown> | undefined;
  if (meta && meta['jupyter_memprof'] === 'dashboard') {
    return true;
  }
  const text = model.data['text/plain'];
  return text === '' || (Array.isArray(text) && text.length === 0);
}

function restored(manager: IWidgetManager): Promise<void> {
  if (manager.restoredStatus !== false || !manager.restored) {
    return Promise.resolve();
  }
  const signal = manager.restored;
  return new Promise(resolve => {
    const done = (): void => {
      signal.disconnect(done);
      resolve();
    };
    signal.connect(done);
  });
}

/** How long a dashboard waits for BokehJS before it is drawn anyway (and fails as before). */
const BOKEHJS_WAIT_MS = 20000;

/** Resolves when the page has BokehJS, or after `ms`. */
function bokehJS(ms: number): Promise<void> {
  const start = Date.now();
  return new Promise(resolve => {
    const check = (): void => {
      if (hasBokehJS() || Date.now() - start > ms) {
        resolve();
      } else {
        setTimeout(check, 100);
      }
    };
    check();
  });
}

function guard(renderer: IWidgetRenderer): IWidgetRenderer {
  const delegate = renderer._manager;
  if (renderer.__memprofGuarded || !delegate || !(delegate.promise instanceof Promise)) {
    return renderer; // not the ipywidgets renderer this was written for: left as it is
  }
  renderer.__memprofGuarded = true;
  const render = renderer.renderModel.bind(renderer);
  renderer.renderModel = async (model: IRenderMime.IMimeModel): Promise<void> => {
    const source = model.data[WIDGET_MIME] as { model_id?: string } | undefined;
    const id = source?.model_id;
    if (!id || !isOurs(model)) {
      return render(model);
    }
    const manager = await delegate.promise;
    if (typeof manager.has_model !== 'function') {
      return render(model);
    }
    await restored(manager);
    if (!manager.has_model(id)) {
      renderer.node.textContent = GONE_NOTE;
      renderer.node.classList.add('memprof-dashboard-gone');
      return;
    }
    renderer.node.classList.remove('memprof-dashboard-gone');
    // jupyter_bokeh's views need BokehJS as they are made: the browser's copy, else the one
    // the panel's link asks the kernel for (when the kernel serves the panel)
    if (!loadRememberedBokehJS()) {
      await bokehJS(BOKEHJS_WAIT_MS);
    }
    return render(model);
  };
  return renderer;
}

/**
 * Guard the widget outputs of `rendermime` (a notebook's): the factory it has now, and the
 * one ipywidgets puts in its place once the notebook's kernel is ready.
 */
export function guardWidgetOutputs(rendermime: IRenderMimeRegistry): void {
  const wrap = (factory: IRenderMime.IRendererFactory): IRenderMime.IRendererFactory => ({
    safe: factory.safe,
    mimeTypes: factory.mimeTypes,
    defaultRank: factory.defaultRank,
    createRenderer: options => guard(factory.createRenderer(options) as IWidgetRenderer)
  });
  const registry = rendermime as IRenderMimeRegistry & { __memprofGuarded?: boolean };
  if (registry.__memprofGuarded) {
    return;
  }
  registry.__memprofGuarded = true;
  const add = rendermime.addFactory.bind(rendermime);
  rendermime.addFactory = (factory: IRenderMime.IRendererFactory, rank?: number): void => {
    const ours = factory.mimeTypes.length === 1 && factory.mimeTypes[0] === WIDGET_MIME;
    add(ours ? wrap(factory) : factory, rank);
  };
  const current = rendermime.getFactory(WIDGET_MIME);
  if (current) {
    add(wrap(current), rendermime.getRank(WIDGET_MIME));
  }
}
