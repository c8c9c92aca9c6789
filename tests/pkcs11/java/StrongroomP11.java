// A Java consumer of libstrongroom-pkcs11.so through the JDK's own SunPKCS11 provider,
// compiled and run by tests/pkcs11/test_java.py. It prints one "name value" line per
// result; the test parses them and checks the ciphertext and the signatures outside Java.
//
//   java StrongroomP11 <sunpkcs11 config> <PIN> <AES key alias>

import java.nio.charset.StandardCharsets;
import java.security.Key;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.KeyStore;
import java.security.Provider;
import java.security.SecureRandom;
import java.security.Security;
import java.security.Signature;
import java.security.spec.MGF1ParameterSpec;
import java.security.spec.PSSParameterSpec;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.Collections;
import java.util.HexFormat;
import java.util.List;
import javax.crypto.Cipher;
import javax.crypto.spec.GCMParameterSpec;

public final class StrongroomP11 {
    private static void out(String name, String value) {
        System.out.println(name + " " + value);
    }

    private static String b64(byte[] b) {
        return Base64.getEncoder().encodeToString(b);
    }

    public static void main(String[] args) throws Exception {
        Provider provider = Security.getProvider("SunPKCS11").configure(args[0]);
        Security.addProvider(provider);
        out("provider", provider.getName());

        KeyStore store = KeyStore.getInstance("PKCS11", provider);
        store.load(null, args[1].toCharArray());
        List<String> aliases = new ArrayList<>(Collections.list(store.aliases()));
        Collections.sort(aliases);
        out("aliases", String.join(",", aliases));

        Key aes = store.getKey(args[2], null);
        out("aes-algorithm", aes.getAlgorithm());
        byte[] data = "rows 1 to 10,000 of the ledger".getBytes(StandardCharsets.UTF_8);
        byte[] aad = "table=ledger".getBytes(StandardCharsets.UTF_8);
        byte[] iv = new byte[12];
        new SecureRandom().nextBytes(iv);
        Cipher gcm = Cipher.getInstance("AES/GCM/NoPadding", provider);
        gcm.init(Cipher.ENCRYPT_MODE, aes, new GCMParameterSpec(128, iv));
        gcm.updateAAD(aad);
        byte[] sealed = gcm.doFinal(data);
        gcm.init(Cipher.DECRYPT_MODE, aes, new GCMParameterSpec(128, iv));
        gcm.updateAAD(aad);
        byte[] opened = gcm.doFinal(sealed);
        out("gcm-iv", HexFormat.of().formatHex(iv));
        out("gcm-ciphertext", HexFormat.of().formatHex(sealed));
        out("gcm-roundtrip", Arrays.equals(opened, data) ? "ok" : "MISMATCH");
        out("gcm-data", b64(data));

        KeyPairGenerator generator = KeyPairGenerator.getInstance("RSA", provider);
        generator.initialize(2048);
        KeyPair pair = generator.generateKeyPair();
        out("rsa-public", b64(pair.getPublic().getEncoded()));
        Signature pkcs1 = Signature.getInstance("SHA256withRSA", provider);
        pkcs1.initSign(pair.getPrivate());
        pkcs1.update(data);
        out("rsa-pkcs1-signature", b64(pkcs1.sign()));
        // SunPKCS11 accepts PSS parameters only for a digest the token lists (CKM_SHA256);
        // a failure is reported as a line of its own so that the other results still count
        try {
            Signature pss = Signature.getInstance("SHA256withRSASSA-PSS", provider);  // CKM_SHA256_RSA_PKCS_PSS
            pss.setParameter(new PSSParameterSpec("SHA-256", "MGF1", MGF1ParameterSpec.SHA256, 32, 1));
            pss.initSign(pair.getPrivate());
            pss.update(data);
            out("rsa-pss-signature", b64(pss.sign()));
        } catch (java.security.GeneralSecurityException e) {
            out("rsa-pss-error", e.toString());
        }
        // the token's CKM_SHA256 (computed in the module, no key involved)
        java.security.MessageDigest sha = java.security.MessageDigest.getInstance("SHA-256", provider);
        out("sha256-provider", sha.getProvider().getName());
        out("sha256", b64(sha.digest(data)));
        out("done", "ok");
    }
}
