package rustrec;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/** An HDFS namenode and datanode in one process, for the storage tests. */
public class MiniDfs {
  public static void main(String[] args) throws Exception {
    File base = new File(args[0]);
    Configuration conf = new Configuration();
    conf.setBoolean("dfs.permissions.enabled", false);
    MiniDFSCluster cluster =
        new MiniDFSCluster.Builder(conf, base).nameNodePort(0).numDataNodes(1).build();
    cluster.waitActive();
    Path tmp = new File(base, "port.tmp").toPath();
    Files.writeString(tmp, Integer.toString(cluster.getNameNodePort()));
    Files.move(tmp, new File(base, "port").toPath());
    Thread.sleep(Long.MAX_VALUE);
  }
}
