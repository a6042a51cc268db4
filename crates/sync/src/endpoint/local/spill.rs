//! External sort of directory entry names: sorted runs in anonymous temp files, merged.
use anyhow::Result;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufRead, BufReader, BufWriter, Seek, Write};

pub fn write_run(names: &mut Vec<String>) -> Result<std::fs::File> {
    names.sort();
    let mut f = tempfile::tempfile()?;
    {
        let mut w = BufWriter::new(&mut f);
        for n in names.drain(..) {
            w.write_all(n.as_bytes())?;
            w.write_all(&[0])?; // names never contain NUL
        }
        w.flush()?;
    }
    f.rewind()?;
    Ok(f)
}

pub struct Merge {
    readers: Vec<BufReader<std::fs::File>>,
    heap: BinaryHeap<Reverse<(String, usize)>>,
}

impl Merge {
    pub fn new(runs: Vec<std::fs::File>) -> Result<Self> {
        let mut m = Merge {
            readers: runs.into_iter().map(BufReader::new).collect(),
            heap: BinaryHeap::new(),
        };
        for i in 0..m.readers.len() {
            m.refill(i)?;
        }
        Ok(m)
    }

    fn refill(&mut self, i: usize) -> Result<()> {
        let mut buf = Vec::new();
        if self.readers[i].read_until(0, &mut buf)? > 0 {
            buf.pop();
            self.heap.push(Reverse((String::from_utf8(buf)?, i)));
        }
        Ok(())
    }

    pub fn next(&mut self) -> Result<Option<String>> {
        let Some(Reverse((name, i))) = self.heap.pop() else {
            return Ok(None);
        };
        self.refill(i)?;
        Ok(Some(name))
    }
}
