/**
 * The front end's half of the comm protocol served by `jupyter_memprof/_frontends/comm.py`.
 *
 * One `ProfileLink` per kernel connection. It registers the comm target so the kernel can
 * announce itself when `%load_ext jupyter_memprof` runs, and it asks the kernel whether the
 * extension is already there (open comms with our target, e.g. from before a page reload)
 * before opening a comm itself, so kernels without the extension never see a request.
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

/** The comm target name, shared with `_frontends/comm.py` TARGET. */
export const TARGET = 'jupyter_memprof';

/** Peak of one device, as `comm._info` sends it. */
export interface IDevicePeak {
  device: string;
  bytes: number | null;
  /** As the summary prints it, e.g. `12.3 MiB`. */
  text: string;
}

/** One panel entry, as `comm._info` sends it (`ProfileInfo` in comm.py). */
export interface IProfileInfo {
  sid: number;
  label: string;
  peaks: IDevicePeak[];
  peak_bytes: number | null;
  peak_text: string;
  wall_s: number | null;
  wall_text: string | null;
  taken_ms: number | null;
  counts: { ops: number; allocations: number; events: number };
  /** Bytes the profile's tables hold in the kernel (null when they could not be measured). */
  memory_bytes: number | null;
  /** As the summary prints bytes, e.g. `3.1 MiB` (`?` when unknown). */
  memory_text: string;
  error: string | null;
  estimate: boolean;
}

/** What the panel sends (`REQUESTS` in comm.py); the kernel checks every field. */
export type PanelRequest =
  | { type: 'list' }
  | { type: 'release'; sid: number }
  | { type: 'hide'; sid: number }
  | { type: 'compare'; sids: [number, number] }
  | { type: 'bokehjs' };

/** What the kernel sends. `error` answers one request, on the comm that sent it only. */
export type KernelData =
  | { type: 'hello'; version: string }
  | { type: 'list'; profiles: IProfileInfo[] }
  | { type: 'added'; profile: IProfileInfo }
  | { type: 'released'; sid: number }
  | { type: 'compare'; sids: [number, number]; summary: string }
  /** The script a dashboard's output runs to put BokehJS into the page. */
  | { type: 'bokehjs'; js: string }
  | {
      type: 'error';
      message: string;
      /** The failed request's type, when it had a known one. */
      request: PanelRequest['type'] | null;
      /** The profile the request named, when it named one. */
      sid: number | null;
    };

/** The kernel's answer to a compare request: the two profiles and the headline. */
export interface IComparison {
  sids: [number, number];
  summary: string;
}

export class ProfileLink implements IDisposable {
  constructor(kernel: Kernel.IKernelConnection) {
    this.kernel = kernel;
    kernel.registerCommTarget(TARGET, this._onCommOpen);
    kernel.statusChanged.connect(this._onStatus, this);
    kernel.disposed.connect(this.dispose, this);
    void this.probe();
  }

  readonly kernel: Kernel.IKernelConnection;

  /** Newest first. */
  get profiles(): readonly IProfileInfo[] {
    return this._profiles;
  }

  /** Whether the kernel has the extension loaded and talks to us. */
  get connected(): boolean {
    return this._comm !== null;
  }

  /** The list or the connection state changed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** A profile was released in the kernel. */
  get released(): ISignal<this, number> {
    return this._released;
  }

  /** The kernel restarted or died: every profile of it is gone. */
  get reset(): ISignal<this, void> {
    return this._reset;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Ask the kernel to release one profile (drop its tables). */
  release(sid: number): void {
    this._send({ type: 'release', sid });
  }

  /** Tell the kernel a dashboard of `sid` was closed, so it can close its widgets. */
  hide(sid: number): void {
    this._send({ type: 'hide', sid });
  }

  /** Ask the kernel to compare two profiles; `compared` answers. */
  compare(a: number, b: number): void {
    this._send({ type: 'compare', sids: [a, b] });
  }

  /** The kernel accepted a compare request (its headline included). */
  get compared(): ISignal<this, IComparison> {
    return this._compared;
  }

  /**
   * BokehJS is in the page after this link asked for it (its answer brought it, or another
   * kernel's did first): the dashboards restored from the kernel before it came could not
   * draw, and can now.
   */
  get bokehLoaded(): ISignal<this, void> {
    return this._bokehLoaded;
  }

  /** A comm to the kernel was opened (the kernel serves the panel from now on). */
  get attached(): ISignal<this, void> {
    return this._attached;
  }

  /**
   * Ask the kernel for BokehJS (once per comm), unless the page has it: a reloaded page's
   * dashboards come back from the kernel, and jupyter_bokeh's views need it to draw.
   * `bokehLoaded` says when it came.
   */
  requestBokehJS(): void {
    const comm = this._comm;
    if (!comm || comm.isDisposed || this._bokehAsked === comm || hasBokehJS()) {
      return;
    }
    this._bokehAsked = comm;
    this._send({ type: 'bokehjs' });
  }

  /**
   * Open a comm if the kernel already serves the panel. Kernels that never loaded the
   * extension have no open comm with our target: nothing is sent to them.
   */
  async probe(): Promise<void> {
    if (this._comm || this._isDisposed) {
      return;
    }
    let reply: KernelMessage.ICommInfoReplyMsg;
    try {
      reply = await this.kernel.requestCommInfo({ target_name: TARGET });
    } catch (reason) {
      return; // kernel gone or restarting; the next status change tells us
    }
    const content = reply.content;
    if (
      this._comm ||
      this._isDisposed ||
      content.status !== 'ok' ||
      Object.keys(content.comms).length === 0
    ) {
      return;
    }
    const comm = this.kernel.createComm(TARGET);
    comm.open({ type: 'connect' });
    this._attach(comm);
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    const comm = this._comm;
    this._comm = null;
    if (comm && !comm.isDisposed && !this.kernel.isDisposed) {
      try {
        comm.close();
      } catch (reason) {
        // the kernel connection may already be gone
      }
    }
    if (!this.kernel.isDisposed) {
      this.kernel.removeCommTarget(TARGET, this._onCommOpen);
    }
    this._profiles = [];
    this._reset.emit();
    this._changed.emit();
    Signal.clearData(this);
  }

  private _onCommOpen = (comm: Kernel.IComm): void => {
    this._attach(comm);
  };

  private _attach(comm: Kernel.IComm): void {
    const previous = this._comm;
    this._comm = comm;
    comm.onMsg = msg => this._onMsg(comm, msg.content.data as unknown as KernelData);
    comm.onClose = () => {
      if (this._comm === comm) {
        this._comm = null;
        this._profiles = [];
        this._changed.emit();
      }
    };
    if (previous && !previous.isDisposed) {
      previous.close();
    }
    const list: PanelRequest = { type: 'list' };
    comm.send(list);
    this._changed.emit();
    this._attached.emit();
  }

  private _send(data: PanelRequest): void {
    if (this._comm && !this._comm.isDisposed) {
      this._comm.send(data);
    }
  }

  private _onMsg(comm: Kernel.IComm, data: KernelData): void {
    if (comm !== this._comm) {
      return;
    }
    switch (data.type) {
      case 'list':
        this._profiles = [...data.profiles].sort((a, b) => b.sid - a.sid);
        break;
      case 'added':
        this._profiles = [
          data.profile,
          ...this._profiles.filter(p => p.sid !== data.profile.sid)
        ].sort((a, b) => b.sid - a.sid);
        break;
      case 'released':
        this._profiles = this._profiles.filter(p => p.sid !== data.sid);
        this._released.emit(data.sid);
        break;
      case 'compare':
        this._compared.emit({ sids: data.sids, summary: data.summary });
        return;
      case 'bokehjs':
        if (!hasBokehJS() && typeof data.js === 'string') {
          // The script a dashboard's output runs (the kernel's notebook_loader.js): it
          // loads this Bokeh version's bundles unless the page has them.
          new Function(data.js).call(window);
        }
        if (hasBokehJS()) {
          // also when another kernel's answer brought it first: this kernel's dashboards
          // may have failed before either came
          this._bokehLoaded.emit();
        }
        return;
      case 'error':
        console.warn(`jupyter_memprof: ${data.message}`);
        if (data.request === 'release' && data.sid !== null) {
          // The kernel has no such profile (released elsewhere): drop it here too.
          const sid = data.sid;
          this._profiles = this._profiles.filter(p => p.sid !== sid);
          this._released.emit(sid);
          break;
        }
        return;
      default:
        return;
    }
    this._changed.emit();
  }

  private _onStatus(_: Kernel.IKernelConnection, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      // The kernel connection disposes its comms on restart; the new process starts empty.
      this._comm = null;
      this._profiles = [];
      this._reset.emit();
      this._changed.emit();
    }
  }

  private _comm: Kernel.IComm | null = null;
  private _profiles: IProfileInfo[] = [];
  private _isDisposed = false;
  private _changed = new Signal<this, void>(this);
  private _released = new Signal<this, number>(this);
  private _reset = new Signal<this, void>(this);
  private _compared = new Signal<this, IComparison>(this);
  private _bokehLoaded = new Signal<this, void>(this);
  private _attached = new Signal<this, void>(this);
  private _bokehAsked: Kernel.IComm | null = null;
}

/** Whether the page has BokehJS with the widgets and tables the dashboards use. */
export function hasBokehJS(): boolean {
  const bokeh = (window as any).Bokeh;
  return !!(bokeh && bokeh.Widgets && bokeh.Tables);
}

/**
 * Where the page keeps the last BokehJS script a kernel sent (a dashboard's output or the
 * link's answer run it; it stores itself: `_views/js/notebook_loader.js`).
 */
const BOKEHJS_KEY = 'jupyter-memprof:bokehjs';

/**
 * Put the BokehJS a kernel sent before (in an earlier load of the page) into the page,
 * unless the page has it. The script itself loads nothing when the page has its version.
 * Returns whether the page has BokehJS now.
 */
export function loadRememberedBokehJS(): boolean {
  if (hasBokehJS()) {
    return true;
  }
  let js: string | null = null;
  try {
    js = window.localStorage.getItem(BOKEHJS_KEY);
  } catch (reason) {
    return false;
  }
  if (js) {
    try {
      new Function(js).call(window);
    } catch (reason) {
      console.warn('jupyter_memprof: the remembered BokehJS did not load', reason);
      window.localStorage.removeItem(BOKEHJS_KEY);
      window.localStorage.removeItem(`${BOKEHJS_KEY}-version`);
    }
  }
  return hasBokehJS();
}

/** One link per kernel connection, created on demand, dropped with the connection. */
export class LinkRegistry {
  get(kernel: Kernel.IKernelConnection): ProfileLink {
    let link = this._links.get(kernel);
    if (!link || link.isDisposed) {
      link = new ProfileLink(kernel);
      this._links.set(kernel, link);
      kernel.disposed.connect(() => this._links.delete(kernel));
      this._created.emit(link);
    }
    return link;
  }

  /** A link was created (the dashboards listen to its `released` and `reset`). */
  get created(): ISignal<this, ProfileLink> {
    return this._created;
  }

  private _links = new Map<Kernel.IKernelConnection, ProfileLink>();
  private _created = new Signal<this, ProfileLink>(this);
}
