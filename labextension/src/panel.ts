/**
 * The "Memory profiles" side panel: the profiles captured in the active notebook's kernel,
 * newest first, each with its label and peak (a bar relative to the largest peak of the same kind,
 * capture or estimate, on the same device).
 *
 * Every string that comes from the kernel (labels, device names, error messages) is written
 * with `textContent`; the panel never builds HTML from data.
 */

import { NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { IProfileInfo, LinkRegistry, ProfileLink } from './link';

/** How many entries can be selected at once (for comparing two profiles). */
const MAX_SELECTED = 2;

export class ProfilesPanel extends Widget {
  constructor(links: LinkRegistry) {
    super();
    this._links = links;
    this.id = 'jupyter-memprof-panel';
    this.addClass('memprof-panel');
    this.title.caption = 'Memory profiles';

    const header = document.createElement('div');
    header.className = 'memprof-panel-header';
    const h = document.createElement('h2');
    h.textContent = 'Memory profiles';
    header.appendChild(h);
    this._compare = document.createElement('button');
    this._compare.className = 'memprof-compare-button';
    this._compare.textContent = 'Compare';
    this._compare.title = 'Ctrl/Cmd-click two profiles, then compare them in a tab';
    this._compare.addEventListener('click', () => {
      if (this._selection.length === MAX_SELECTED) {
        // the older profile is a, the newer b
        const [a, b] = [...this._selection].sort((x, y) => x - y);
        this._link?.compare(a, b);
      }
    });
    header.appendChild(this._compare);
    this._status = document.createElement('div');
    this._status.className = 'memprof-panel-status';
    header.appendChild(this._status);
    this._list = document.createElement('ul');
    this._list.className = 'memprof-list';
    this.node.appendChild(header);
    this.node.appendChild(this._list);
    this._render();
  }

  /** The notebook whose kernel the panel shows (the active notebook). */
  get notebook(): NotebookPanel | null {
    return this._notebook;
  }

  /** The link of the notebook's current kernel, if it has one. */
  get link(): ProfileLink | null {
    return this._link;
  }

  /** Session ids selected with Ctrl/Cmd-click (at most two, oldest dropped first). */
  get selection(): readonly number[] {
    return this._selection;
  }

  /** The user asked for a profile's dashboard. */
  get openRequested(): ISignal<this, IProfileInfo> {
    return this._openRequested;
  }

  /** Follow another notebook (or none). */
  follow(notebook: NotebookPanel | null): void {
    if (notebook === this._notebook) {
      return;
    }
    if (this._notebook) {
      this._notebook.sessionContext.kernelChanged.disconnect(this._onKernel, this);
    }
    this._notebook = notebook;
    if (notebook) {
      notebook.sessionContext.kernelChanged.connect(this._onKernel, this);
    }
    this._onKernel();
  }

  dispose(): void {
    this._setLink(null);
    if (this._notebook) {
      this._notebook.sessionContext.kernelChanged.disconnect(this._onKernel, this);
    }
    super.dispose();
  }

  private _onKernel(): void {
    const kernel = this._notebook?.sessionContext.session?.kernel ?? null;
    this._setLink(kernel ? this._links.get(kernel) : null);
  }

  private _setLink(link: ProfileLink | null): void {
    if (link === this._link) {
      this._render();
      return;
    }
    if (this._link) {
      this._link.changed.disconnect(this._render, this);
    }
    this._link = link;
    if (link) {
      link.changed.connect(this._render, this);
    }
    this._setSelection([]);
    this._render();
  }

  private _setSelection(sids: number[]): void {
    this._selection = sids;
  }

  private _toggle(sid: number): void {
    if (this._selection.includes(sid)) {
      this._setSelection(this._selection.filter(s => s !== sid));
    } else {
      this._setSelection([...this._selection, sid].slice(-MAX_SELECTED));
    }
    this._render();
  }

  private _render(): void {
    const link = this._link;
    const profiles = link?.profiles ?? [];
    // Drop selected profiles that are gone.
    const live = new Set(profiles.map(p => p.sid));
    if (this._selection.some(s => !live.has(s))) {
      this._setSelection(this._selection.filter(s => live.has(s)));
    }

    if (!this._notebook) {
      this._status.textContent = 'Open a notebook to see its memory profiles.';
    } else if (!link) {
      this._status.textContent = `${this._notebook.title.label}: no kernel.`;
    } else if (!link.connected) {
      this._status.textContent =
        `${this._notebook.title.label}: run %load_ext jupyter_memprof, or ` +
        '"Profile memory of this cell" from the cell menu.';
    } else if (profiles.length === 0) {
      this._status.textContent = `${this._notebook.title.label}: no profiles yet.`;
    } else {
      const n = profiles.length;
      this._status.textContent = `${this._notebook.title.label}: ${n} profile${n === 1 ? '' : 's'}`;
    }

    this._compare.disabled = !(link?.connected && this._selection.length === MAX_SELECTED);
    // One scale per kind and device: a CPU capture's bar is never drawn against a cuda:0
    // estimate's; each bar is relative to the largest peak of its own group.
    const largest = new Map<string, number>();
    for (const p of profiles) {
      const g = scaleGroup(p);
      largest.set(g, Math.max(largest.get(g) ?? 0, p.peak_bytes ?? 0));
    }
    this._list.replaceChildren(
      ...profiles.map(p => this._entry(p, largest.get(scaleGroup(p)) ?? 0))
    );
  }

  private _entry(p: IProfileInfo, largest: number): HTMLLIElement {
    const li = document.createElement('li');
    li.className = 'memprof-entry';
    if (this._selection.includes(p.sid)) {
      li.classList.add('memprof-selected');
    }
    if (p.error) {
      li.classList.add('memprof-entry-failed');
    }
    li.dataset.sid = String(p.sid);
    li.tabIndex = 0;
    li.title = 'Open the dashboard (Ctrl/Cmd-click selects, for comparing two)';

    const head = div('memprof-entry-head');
    const label = span('memprof-entry-label', p.label);
    label.title = p.label;
    head.appendChild(label);
    if (p.estimate) {
      // not a run: an estimate on fake tensors (whatever its label says)
      const badge = span('memprof-entry-estimate', 'estimate');
      badge.title = 'Estimated on fake tensors: nothing ran, no memory was used';
      head.appendChild(badge);
      li.classList.add('memprof-entry-is-estimate');
    }
    head.appendChild(span('memprof-entry-peak', p.peak_text));
    const release = document.createElement('button');
    release.className = 'memprof-entry-release';
    release.textContent = 'Release';
    release.title = `Free the ${p.memory_text} this profile holds in the kernel`;
    release.addEventListener('click', event => {
      event.stopPropagation();
      release.disabled = true;
      this._link?.release(p.sid);
    });
    head.appendChild(release);
    li.appendChild(head);

    const bar = div('memprof-entry-bar');
    const fill = div('memprof-entry-bar-fill');
    const fraction = largest > 0 && p.peak_bytes ? p.peak_bytes / largest : 0;
    fill.style.width = `${(100 * fraction).toFixed(1)}%`;
    const group = scaleGroup(p);
    bar.dataset.scale = group;
    bar.title = `${p.peak_text}: ${(100 * fraction).toFixed(0)}% of the largest ${group} peak listed`;
    bar.appendChild(fill);
    li.appendChild(bar);

    // Where and when: devices (with their peaks when several), how long it ran, when.
    const when: string[] = [];
    if (p.peaks.length > 1) {
      when.push(p.peaks.map(d => `${d.device} ${d.text}`).join(', '));
    } else if (p.peaks.length === 1) {
      when.push(p.peaks[0].device);
    }
    if (p.wall_text !== null) {
      when.push(p.estimate ? `estimated in ${p.wall_text}` : `ran ${p.wall_text}`);
    }
    if (p.taken_ms !== null) {
      const taken = new Date(p.taken_ms);
      const pad = (n: number) => String(n).padStart(2, '0');
      when.push(`at ${pad(taken.getHours())}:${pad(taken.getMinutes())}`);
      li.title += `\nTaken at ${taken.toLocaleString()}`;
    }
    li.appendChild(div('memprof-entry-meta', when.join(' · ')));
    // How much: the memory its tables hold in the kernel (what Release frees), their sizes.
    const { ops, allocations, events } = p.counts;
    const counts = div('memprof-entry-meta memprof-entry-counts');
    const held = span('memprof-entry-memory', `holds ${p.memory_text}`);
    held.title = "Memory this profile's tables hold in the kernel";
    counts.appendChild(held);
    counts.appendChild(
      document.createTextNode(
        ` · ${ops.toLocaleString()} ops · ${allocations.toLocaleString()} blocks · ` +
          `${events.toLocaleString()} events`
      )
    );
    li.appendChild(counts);
    if (p.error) {
      li.appendChild(div('memprof-entry-error', p.error));
    }

    li.addEventListener('click', event => {
      if (event.ctrlKey || event.metaKey) {
        this._toggle(p.sid);
      } else {
        this._openRequested.emit(p);
      }
    });
    li.addEventListener('keydown', event => {
      if (event.target !== li) {
        return;
      }
      if (event.key === 'Enter') {
        this._openRequested.emit(p);
      } else if (event.key === ' ') {
        event.preventDefault();
        this._toggle(p.sid);
      }
    });
    return li;
  }

  private _links: LinkRegistry;
  private _notebook: NotebookPanel | null = null;
  private _link: ProfileLink | null = null;
  private _selection: number[] = [];
  private _status: HTMLDivElement;
  private _compare: HTMLButtonElement;
  private _list: HTMLUListElement;
  private _openRequested = new Signal<this, IProfileInfo>(this);
}

function div(className: string, text?: string): HTMLDivElement {
  const node = document.createElement('div');
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function span(className: string, text: string): HTMLSpanElement {
  const node = document.createElement('span');
  node.className = className;
  node.textContent = text;
  return node;
}

/**
 * The scale a profile's peak bar is drawn on: its kind and the device of its peak, as
 * "cuda:0 estimate" or "cpu capture" (bars of different groups are not comparable).
 */
export function scaleGroup(p: IProfileInfo): string {
  const top = p.peaks.find(d => d.bytes !== null && d.bytes === p.peak_bytes);
  return `${top ? top.device : 'no device'} ${p.estimate ? 'estimate' : 'capture'}`;
}
