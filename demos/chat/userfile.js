// Runs inside the ember Worker (EmberWorker.callJs): a file the user picked (a File or Blob; a
// Blob crosses to the worker as a handle, not a copy) written into Pyodide's file system in
// chunks, with progress. The file's node is sized once up front, so it never holds two copies
// (MEMFS would otherwise double its buffer as it grows); at most one chunk is read at a time.

const CHUNK = 16 << 20;   // bytes read per step

export async function writeFile(ctx, blob, path) {
  if (!(blob instanceof Blob)) throw new TypeError("writeFile: give a File or a Blob");
  const FS = ctx.pyodide.FS;
  const dir = path.slice(0, path.lastIndexOf("/"));
  if (dir) FS.mkdirTree(dir);
  const total = blob.size;
  const stream = FS.open(path, "w");
  try {
    FS.ftruncate(stream.fd, total);   // one buffer of the final size
    for (let pos = 0; pos < total; pos += CHUNK) {
      const part = new Uint8Array(await blob.slice(pos, Math.min(pos + CHUNK, total)).arrayBuffer());
      FS.write(stream, part, 0, part.length, pos);
      const loaded = pos + part.length;
      ctx.progress(loaded / total, `${(loaded / 1e6).toFixed(1)} / ${(total / 1e6).toFixed(1)} MB`,
                   { loaded, total });
    }
  } catch (e) {
    FS.close(stream);
    try { FS.unlink(path); } catch { /* already gone */ }
    throw e;
  }
  FS.close(stream);
  return { bytes: total };
}
