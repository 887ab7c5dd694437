/**
 * A main-area tab showing one profile's dashboard.
 *
 * The dashboard is not drawn here: the tab runs `jupyter_memprof._frontends.comm.show(sid)` in the
 * notebook's kernel (not stored in the history, no execution count) and renders what it
 * displays with an output area using the notebook's own rendermime, whose widget renderer
 * knows that kernel's ipywidgets. So there is one dashboard implementation, `Profile.show()`.
 */

import { MainAreaWidget } from '@jupyterlab/apputils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { OutputArea, OutputAreaModel } from '@jupyterlab/outputarea';
import { KernelMessage } from '@jupyterlab/services';
import { Panel } from '@lumino/widgets';

import { IProfileInfo, ProfileLink } from './link';

/** The kernel code the tab runs: no names are left in the user's namespace. */
export function showCode(sid: number): string {
  if (!Number.isInteger(sid)) {
    throw new Error(`not a profile id: ${sid}`);
  }
  return `__import__('jupyter_memprof._frontends.comm', fromlist=['show']).show(${sid})`;
}

/** The kernel code of a comparison tab (profile `a` against profile `b`). */
export function compareCode(a: number, b: number): string {
  if (!Number.isInteger(a) || !Number.isInteger(b)) {
    throw new Error(`not profile ids: ${a}, ${b}`);
  }
  return (
    "__import__('jupyter_memprof._frontends.comm', fromlist=['show_comparison'])" +
    `.show_comparison(${a}, ${b})`
  );
}

/** What a comparison tab shows: profile `info` (a) against `other` (b). */
export interface ICompareWith {
  other: IProfileInfo;
  summary: string;
}

export class DashboardWidget extends MainAreaWidget<Panel> {
  constructor(
    notebook: NotebookPanel,
    link: ProfileLink,
    info: IProfileInfo,
    compare: ICompareWith | null = null
  ) {
    const content = new Panel();
    content.addClass('memprof-dashboard');
    super({ content });
    this.sid = info.sid;
    this.sids = compare ? [info.sid, compare.other.sid] : [info.sid];
    this.link = link;
    this._code = compare ? compareCode(info.sid, compare.other.sid) : showCode(info.sid);
    this._compare = compare !== null;
    if (compare) {
      this.id = `jupyter-memprof-compare-${link.kernel.id}-${info.sid}-${compare.other.sid}`;
      this.addClass('memprof-compare-tab');
      this.title.label = `Memory: ${info.label} vs ${compare.other.label}`;
      this.title.caption = `${compare.summary}\nin ${notebook.title.label}`;
    } else {
      this.id = `jupyter-memprof-dashboard-${link.kernel.id}-${info.sid}`;
      this.title.label = `Memory: ${info.label}`;
      this.addClass('memprof-dashboard-tab');
      this.title.caption = `Memory profile "${info.label}" in ${notebook.title.label}`;
    }
    this.title.closable = true;

    this._status = new Panel();
    this._status.addClass('memprof-dashboard-status');
    this._status.node.textContent = 'Rendering the dashboard in the kernel…';
    content.addWidget(this._status);

    this._output = new OutputArea({
      model: new OutputAreaModel({ trusted: true }),
      rendermime: notebook.content.rendermime
    });
    this._output.addClass('memprof-dashboard-output');
    content.addWidget(this._output);
    // The output area renders widgets through the notebook's widget manager, which goes
    // away with the notebook.
    notebook.disposed.connect(() => this.dispose());
    void this._run();
  }

  readonly sid: number;
  /** The profiles shown: one for a dashboard, two for a comparison. */
  readonly sids: number[];
  readonly link: ProfileLink;

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    // A comparison's widgets are closed by the kernel when either profile is released;
    // hiding a profile here would also close its dashboard in another tab.
    if (!this._compare && !this.link.isDisposed && this.link.connected) {
      this.link.hide(this.sid);
    }
    super.dispose();
  }

  private async _run(): Promise<void> {
    const kernel = this.link.kernel;
    const future = kernel.requestExecute({
      code: this._code,
      silent: false,
      store_history: false,
      stop_on_error: false,
      allow_stdin: false
    });
    this._output.future = future;
    let reply: KernelMessage.IExecuteReplyMsg;
    try {
      reply = await future.done;
    } catch (reason) {
      if (!this.isDisposed) {
        this._status.node.textContent = 'The kernel went away before the dashboard was drawn.';
      }
      return;
    }
    if (this.isDisposed) {
      return;
    }
    if (reply.content.status === 'ok') {
      this._status.hide();
    } else if (reply.content.status === 'error') {
      this._status.node.textContent = `The kernel could not show this profile: ${reply.content.ename}: ${reply.content.evalue}`;
    }
  }

  private _output: OutputArea;
  private _status: Panel;
  private _code: string;
  private _compare: boolean;
}
